"""Imports every command module so that each registers its commands on the `cli` group."""

from mlbench.cli import runs  # noqa: F401
from mlbench.cli import clusters  # noqa: F401
from mlbench.cli import results  # noqa: F401
from mlbench.cli import serve  # noqa: F401
from mlbench.cli import optimizers  # noqa: F401
from mlbench.cli import dashboard  # noqa: F401
from mlbench.cli import follow  # noqa: F401
from mlbench.cli import check  # noqa: F401
from mlbench.cli import data  # noqa: F401
from mlbench.cli import predict  # noqa: F401
