"""Every distributed optimizer, looked up by name.

Importing this module imports every optimizer module, so each registers itself (see
:mod:`mlbench.optim.registry`). :data:`ORDER` is the order in which ``mlbench optimizers`` and the
README list them: the reference first, then the other all-reduce methods, then the compressing and
decentralized ones, then the plain-PyTorch baseline.
"""

from __future__ import annotations

from typing import Any

from mlbench.errors import UsageError
from mlbench.optim import centralized, ddp, decentralized, powersgd, signsgd, sparsified  # noqa: F401
from mlbench.optim.base import DistributedOptimizer, OptimizerContext
from mlbench.optim.registry import OPTIMIZERS

ORDER = ("centralized-sgd", "centralized-adam", "model-averaging", "powersgd", "signsgd",
         "sparsified-sgd", "decentralized-sgd", "ddp")

#: The closed division's optimizer (docs/tasks.md, "Algorithm").
REFERENCE_OPTIMIZER = "centralized-sgd"


def check_optimizer(name: str, options: dict[str, str],
                    world_size: int | None = None) -> type[DistributedOptimizer]:
    """The optimizer class for ``name``, after checking that it exists and takes ``options``
    (and, given ``world_size``, that they fit that many workers)."""
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise UsageError(f"unknown optimizer {name!r}; choose one of: {', '.join(sorted(OPTIMIZERS))} "
                         "(see `mlbench optimizers`)") from None
    cls.parse_options(options, world_size)
    return cls


def build_optimizer(name: str, ctx: OptimizerContext) -> DistributedOptimizer:
    return check_optimizer(name, ctx.options, ctx.world_size)(ctx)


def describe_optimizers() -> list[dict[str, Any]]:
    """Every optimizer with its division, summary, reference and options (for the CLI/README)."""
    return [{"name": cls.name, "closed_division": cls.closed_division, "summary": cls.summary,
             "reference": cls.reference,
             "options": [{"name": key, "default": opt.default, "help": opt.help}
                         for key, opt in cls.options.items()]}
            for cls in (OPTIMIZERS[name] for name in ORDER)]
