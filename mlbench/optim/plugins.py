"""Optimizer plug-ins: the open division's own optimizers, loaded from a file, a module or an
installed package's entry point, beside the built-ins.

A plug-in is exactly what a built-in is: a subclass of
:class:`mlbench.optim.base.DistributedOptimizer` with an ``info = OptimizerInfo(...)`` that
declares its name and ``--opt`` options, implementing ``step(lr)`` (docs/plugins.md).
``--optimizer`` names it as ``FILE.py:CLASS``, ``package.module:CLASS`` or the name of an entry
point in the group ``mlbench.optimizers``.

The source is read, kept with the run and executed from the run's copy by
:mod:`mlbench.plugins`, which model plug-ins share; this module checks that what it names is an
optimizer (:func:`resolve_optimizer` in the CLI, :func:`load_recorded` in a worker) and guards
its ``step``.

Loading a plug-in imports torch (its class subclasses the torch-based base class); built-in
names never come here, and the CLI stays torch-free for them.
"""

from __future__ import annotations

import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlbench.errors import MlbenchError, UsageError
from mlbench.optim.descriptors import INFO, OptimizerInfo, describe
from mlbench.plugins import (
    PLUGIN_DIR,
    SHORT_HASH,
    Loaded,
    PluginError,
    entry_points,
    installed,
    is_plugin_label,
    last_line,
    load,
    load_copy,
    plugin_label,
)

if TYPE_CHECKING:
    from mlbench.optim.base import DistributedOptimizer

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGIN_DIR",
    "SHORT_HASH",
    "Plugin",
    "PluginError",
    "describe_one",
    "describe_plugins",
    "guard_steps",
    "installed_plugins",
    "is_builtin",
    "is_plugin_label",
    "load_recorded",
    "make_plugin",
    "plugin_label",
    "resolve_optimizer",
]

#: The entry-point group an installed package registers its optimizers in.
ENTRY_POINT_GROUP = "mlbench.optimizers"
#: What a plug-in's name may be.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: How errors name this kind of plug-in.
NOUN = "optimizer plug-in"


@dataclass(frozen=True)
class Plugin:
    """A plug-in optimizer as read from its source (:class:`mlbench.plugins.Loaded`: where from,
    the bytes) and the class it defines."""

    loaded: Loaded
    cls: type[DistributedOptimizer]

    @property
    def spec(self) -> str:
        """As the user gave it."""
        return self.loaded.spec

    @property
    def kind(self) -> str:
        """"file", "module" or "entry-point"."""
        return self.loaded.kind

    @property
    def class_name(self) -> str:
        return self.loaded.attr

    @property
    def module(self) -> str | None:
        """The module's import name (module and entry-point plug-ins)."""
        return self.loaded.module

    @property
    def origin(self) -> str:
        """The source file it was read from."""
        return self.loaded.origin

    @property
    def source(self) -> bytes:
        return self.loaded.source

    @property
    def distribution(self) -> str | None:
        """An entry point's package, "name version"."""
        return self.loaded.distribution

    @property
    def info(self) -> OptimizerInfo:
        return self.cls.info

    @property
    def sha256(self) -> str:
        return self.loaded.sha256

    @property
    def label(self) -> str:
        """What names the run's optimizer everywhere (catalog, status, compare): its name and
        source, so that two sources never pass for one optimizer."""
        return plugin_label(self.info.name, self.sha256)

    @property
    def copy_path(self) -> str:
        """Where the run folder keeps the source, relative to it."""
        return self.loaded.copy_path

    def record(self, options: dict[str, Any]) -> dict[str, Any]:
        """What run.json says of the plug-in (``config.optimizer_plugin``): enough for a worker to
        load the copy and for a reader to know exactly which code ran with which options."""
        return {"name": self.info.name, **self.loaded.source_record(), "class": self.class_name,
                "options": dict(options)}


def is_builtin(name: str) -> bool:
    return name in INFO


def resolve_optimizer(spec: str) -> Plugin | None:
    """None for a built-in's name; else the plug-in ``spec`` names, loaded and checked, or a
    UsageError in one line (no such file, module or name; an import that fails; a class without
    the interface)."""
    if is_builtin(spec):
        return None

    def unknown() -> str:
        plugins = sorted(entry_points(ENTRY_POINT_GROUP))
        known = ", ".join(sorted(INFO)) + (f"; plug-ins: {', '.join(plugins)}" if plugins else "")
        return (f"unknown optimizer {spec!r}; choose one of: {known} (see `mlbench optimizers`), "
                "or give a plug-in as FILE.py:CLASS or package.module:CLASS")

    loaded = load(spec, noun=NOUN, group=ENTRY_POINT_GROUP, unknown=unknown)
    return Plugin(loaded, _plugin_class(loaded.obj, loaded.attr, spec, loaded.where))


def installed_plugins() -> list[dict[str, Any]]:
    """Every entry point in :data:`ENTRY_POINT_GROUP`: its name, where it points, its package, its
    source's file and SHA-256, or why it cannot be used; none of them imported (``mlbench
    optimizers``; ``mlbench optimizers NAME`` imports the one it is asked for)."""
    return installed(ENTRY_POINT_GROUP, is_builtin, "optimizer")


def describe_plugins() -> list[dict[str, Any]]:
    """The installed plug-ins as ``mlbench optimizers`` lists them without running their code:
    ``name`` (the entry point's, which ``--optimizer`` takes) and ``plugin``: the entry point,
    what it points to, its package, its source file's path and SHA-256, or why it cannot be used
    (``error``)."""
    described = []
    for row in installed_plugins():
        described.append({"name": row["entry_point"], "closed_division": False, "reference_of": [],
                          "plugin": {key: row[key] for key in ("entry_point", "value", "distribution", "origin",
                                                               "sha256", "error") if key in row}})
    return described


def describe_one(spec: str, references: dict[str, str]) -> dict[str, Any]:
    """One optimizer as ``mlbench optimizers NAME`` shows it: a built-in's description, or the
    plug-in ``spec`` names (an entry point, ``FILE.py:CLASS``, ``package.module:CLASS``) imported
    and checked, with its options and where its source came from; a UsageError in one line.
    ``references``: each task's reference optimizer, by task."""
    plugin = resolve_optimizer(spec)
    if plugin is None:
        return describe(INFO[spec], references)
    source = {"spec": spec, "kind": plugin.kind, "origin": plugin.origin, "sha256": plugin.sha256,
              "distribution": plugin.distribution}
    return {**describe(plugin.info, {}), "closed_division": False, "reference_of": [], "plugin": source}


def load_recorded(run_dir: Path, record: dict[str, Any]) -> type[DistributedOptimizer]:
    """The class of the plug-in a run recorded, executed from the run folder's copy (a worker).

    The copy's SHA-256 must be the recorded one: a copy changed after the run was created would
    make the record lie about the code that ran.
    """
    return load_copy(run_dir, record, NOUN, str(record["class"]), _plugin_class)


def guard_steps(optimizer: Any, label: str) -> None:
    """Make a plug-in's failure in ``step`` one line naming the plug-in and the step (counted
    from 1), the traceback going to the worker's log only."""
    original = optimizer.step
    count = 0

    def step(lr: float) -> None:
        nonlocal count
        count += 1
        try:
            original(lr)
        except Exception as err:
            traceback.print_exc()
            raise PluginError(f"optimizer plug-in {label} raised in step {count}: {last_line(err)}") from err

    optimizer.step = step


def make_plugin(cls: type[DistributedOptimizer], ctx: Any, label: str) -> DistributedOptimizer:
    """``cls(ctx)`` with its ``step`` guarded; a failure while it is made is one line too."""
    try:
        optimizer = cls(ctx)
    except MlbenchError:
        raise
    except Exception as err:
        traceback.print_exc()
        raise PluginError(f"optimizer plug-in {label} failed to start: {last_line(err)}") from err
    guard_steps(optimizer, label)
    return optimizer


# -- checking ------------------------------------------------------------------------------------
def _plugin_class(obj: Any, name: str, spec: str, where: str) -> type[DistributedOptimizer]:
    """``obj`` (the module's ``name``), checked to be a usable optimizer class, or a UsageError
    saying why not."""
    if obj is None:
        raise UsageError(f"optimizer plug-in {spec}: {where} defines no {name}", option="optimizer")
    base = sys.modules.get("mlbench.optim.base")  # not imported: nothing can subclass it
    if not isinstance(obj, type) or base is None or not issubclass(obj, base.DistributedOptimizer):
        raise UsageError(f"optimizer plug-in {spec}: {name} is not a subclass of "
                         "mlbench.optim.base.DistributedOptimizer", option="optimizer")
    cls = cast("type[DistributedOptimizer]", obj)
    info = getattr(cls, "info", None)
    if not isinstance(info, OptimizerInfo):
        raise UsageError(f"optimizer plug-in {spec}: {name} has no `info = OptimizerInfo(...)` "
                         "(mlbench.optim.descriptors) saying its name and options", option="optimizer")
    if is_builtin(info.name):
        raise UsageError(f"optimizer plug-in {spec}: {name} calls itself {info.name}, a built-in "
                         "optimizer's name; give its info a name of its own", option="optimizer")
    if not NAME.match(info.name):
        raise UsageError(f"optimizer plug-in {spec}: its name {info.name!r} must be 1-64 letters, digits, "
                         "'-', '_' or '.'", option="optimizer")
    if cls.step is base.DistributedOptimizer.step:
        raise UsageError(f"optimizer plug-in {spec}: {name} does not implement step(lr)", option="optimizer")
    return cls
