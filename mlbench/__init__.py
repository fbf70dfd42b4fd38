"""mlbench: benchmarks for distributed machine-learning training.

The package's front door: ``mlbench.run``, ``mlbench.runs``, ``mlbench.get`` and ``mlbench.compare``
(docs/python-api.md) are :mod:`mlbench.api`'s, imported on first use (PEP 562), so that ``import mlbench`` costs
nothing: the CLI's start-up and every worker import this package, and a script that only asks
for ``mlbench.__version__`` should not pay for the launchers and the run store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlbench.version import __version__

if TYPE_CHECKING:
    from mlbench.api import EVENT_COLUMNS, Run, RunInfo, compare, get, run, runs

#: The names ``mlbench.NAME`` gives, each from :mod:`mlbench.api`.
_API = ("run", "runs", "get", "compare", "Run", "RunInfo", "EVENT_COLUMNS")

__all__ = ["EVENT_COLUMNS", "Run", "RunInfo", "__version__", "compare", "get", "run", "runs"]


def __getattr__(name: str) -> Any:
    if name in _API:
        from mlbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'mlbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
