"""Every distributed optimizer's implementation, looked up by name (in the worker).

Importing this module imports every optimizer module (and torch), so each registers itself (see
:mod:`mlbench.optim.registry`). What the CLI needs (names, options and their checks) is the
torch-free :mod:`mlbench.optim.descriptors`. A plug-in (:mod:`mlbench.optim.plugins`) is
loaded from the run folder's copy of its source, which run.json records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlbench.optim import centralized, ddp, decentralized, diloco, fsdp, powersgd, signsgd, sparsified  # noqa: F401
from mlbench.optim.base import DistributedOptimizer, OptimizerContext
from mlbench.optim.descriptors import optimizer_info
from mlbench.optim.plugins import PluginError, load_recorded, make_plugin, plugin_label
from mlbench.optim.registry import OPTIMIZERS


def build_optimizer(name: str, ctx: OptimizerContext, plugin: dict[str, Any] | None = None,
                    run_dir: Path | None = None) -> DistributedOptimizer:
    """The optimizer ``name`` for ``ctx`` (its options are checked as it is made); with
    ``plugin`` (run.json's record of one), that plug-in, from ``run_dir``'s copy of its source."""
    if plugin is None:
        return OPTIMIZERS[optimizer_info(name).name](ctx)
    label = plugin_label(str(plugin.get("name")), str(plugin.get("sha256")))
    if run_dir is None:
        raise PluginError(f"optimizer plug-in {label}: no run folder to load its source from")
    return make_plugin(load_recorded(run_dir, plugin), ctx, label)
