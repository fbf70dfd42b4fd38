"""Every distributed optimizer's implementation, looked up by name (in the worker).

Importing this module imports every optimizer module (and torch), so each registers itself (see
:mod:`mlbench.optim.registry`). What the CLI needs (names, options and their checks) is the
torch-free :mod:`mlbench.optim.descriptors`.
"""

from __future__ import annotations

from mlbench.optim import centralized, ddp, decentralized, powersgd, signsgd, sparsified  # noqa: F401
from mlbench.optim.base import DistributedOptimizer, OptimizerContext
from mlbench.optim.descriptors import optimizer_info
from mlbench.optim.registry import OPTIMIZERS


def build_optimizer(name: str, ctx: OptimizerContext) -> DistributedOptimizer:
    """The optimizer ``name`` for ``ctx`` (its options are checked as it is made)."""
    return OPTIMIZERS[optimizer_info(name).name](ctx)
