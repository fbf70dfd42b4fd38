"""Optimizer plug-ins: the open division's own optimizers, loaded from a file, a module or an
installed package's entry point, beside the built-ins.

A plug-in is exactly what a built-in is: a subclass of
:class:`mlbench.optim.base.DistributedOptimizer` with an ``info = OptimizerInfo(...)`` that
declares its name and ``--opt`` options, implementing ``step(lr)`` (docs/plugins.md).
``--optimizer`` names it as ``FILE.py:CLASS``, ``package.module:CLASS`` or the name of an entry
point in the group ``mlbench.optimizers``.

Why the source, not the import, is what counts: every worker of a run must run the same code,
on whatever machine it runs, and a result must say which code made it. So the CLI reads the
plug-in's source file once, checks the class it defines (:func:`resolve_optimizer`), and the
run keeps those bytes (``RUN/plugin/<file>.py``) with their SHA-256 in run.json; the workers
execute that copy (:func:`load_recorded`), never the user's path, so that an edit after
``mlbench run`` changes nothing. A module plug-in travels as its one file: what it imports
comes from the workers' environment.

Loading a plug-in imports torch (its class subclasses the torch-based base class); built-in
names never come here, and the CLI stays torch-free for them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlbench.errors import MlbenchError, UsageError
from mlbench.optim.descriptors import INFO, OptimizerInfo, describe

if TYPE_CHECKING:
    from mlbench.optim.base import DistributedOptimizer

#: The entry-point group an installed package registers its optimizers in.
ENTRY_POINT_GROUP = "mlbench.optimizers"
#: The folder of a run that holds its plug-in's source.
PLUGIN_DIR = "plugin"
#: The hex digits of the SHA-256 that name a plug-in's source in tables (``my-sgd@1a2b3c4d5e6f``).
SHORT_HASH = 12

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginError(MlbenchError):
    """A plug-in failed in a worker (its copy is unreadable, it raised while made or stepping)."""


@dataclass(frozen=True)
class Plugin:
    """A plug-in optimizer as read from its source: where from, the bytes, the class."""

    spec: str                 # as the user gave it
    kind: str                 # "file", "module" or "entry-point"
    class_name: str
    module: str | None        # the module's import name (module and entry-point plug-ins)
    origin: str               # the source file it was read from
    source: bytes
    cls: type[DistributedOptimizer]
    distribution: str | None = None  # an entry point's package, "name version"

    @property
    def info(self) -> OptimizerInfo:
        return self.cls.info

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source).hexdigest()

    @property
    def label(self) -> str:
        """What names the run's optimizer everywhere (catalog, status, compare): its name and
        source, so that two sources never pass for one optimizer."""
        return plugin_label(self.info.name, self.sha256)

    @property
    def copy_path(self) -> str:
        """Where the run folder keeps the source, relative to it."""
        stem = self.module if self.module else Path(self.origin).stem
        return f"{PLUGIN_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}.py"  # also a ConfigMap key

    def record(self, options: dict[str, Any]) -> dict[str, Any]:
        """What run.json says of the plug-in (``config.optimizer_plugin``): enough for a worker to
        load the copy and for a reader to know exactly which code ran with which options."""
        return {"name": self.info.name, "spec": self.spec, "kind": self.kind, "class": self.class_name,
                "module": self.module, "origin": self.origin, "distribution": self.distribution,
                "file": self.copy_path, "sha256": self.sha256, "options": dict(options)}


def plugin_label(name: str, sha256: str) -> str:
    return f"{name}@{sha256[:SHORT_HASH]}"


def is_plugin_label(optimizer: str | None) -> bool:
    """Whether a run's optimizer (as the catalog has it) is a plug-in's ``name@sha``."""
    return bool(optimizer) and "@" in str(optimizer)


def is_builtin(name: str) -> bool:
    return name in INFO


def resolve_optimizer(spec: str) -> Plugin | None:
    """None for a built-in's name; else the plug-in ``spec`` names, loaded and checked, or a
    UsageError in one line (no such file, module or name; an import that fails; a class without
    the interface)."""
    if is_builtin(spec):
        return None
    if ":" in spec:
        where, _, name = spec.rpartition(":")
        if not where or not name.isidentifier():
            raise UsageError(f"--optimizer {spec}: give FILE.py:CLASS or package.module:CLASS")
        if where.endswith(".py") or "/" in where or "\\" in where:
            return _from_file(spec, Path(where).expanduser(), name)
        return _from_module(spec, where, name)
    entry = _entry_points().get(spec)
    if entry is None:
        plugins = sorted(_entry_points())
        known = ", ".join(sorted(INFO)) + (f"; plug-ins: {', '.join(plugins)}" if plugins else "")
        raise UsageError(f"unknown optimizer {spec!r}; choose one of: {known} (see `mlbench optimizers`), "
                         "or give a plug-in as FILE.py:CLASS or package.module:CLASS")
    module, _, attr = entry.value.partition(":")
    dist = entry.dist
    distribution = f"{dist.metadata['Name']} {dist.version}" if dist is not None else None
    return _from_module(spec, module.strip(), attr.strip(), kind="entry-point", distribution=distribution)


def installed_plugins() -> list[dict[str, Any]]:
    """Every entry point in :data:`ENTRY_POINT_GROUP`: its name, where it points, its package, and
    the loaded plug-in or why it cannot be loaded (for ``mlbench optimizers``)."""
    found = []
    for name, entry in sorted(_entry_points().items()):
        dist = entry.dist
        row: dict[str, Any] = {"entry_point": name, "value": entry.value,
                               "distribution": f"{dist.metadata['Name']} {dist.version}" if dist else None}
        if is_builtin(name):
            row["error"] = f"a built-in optimizer is called {name}; the built-in is used"
        else:
            try:
                row["plugin"] = resolve_optimizer(name)
            except UsageError as err:
                row["error"] = str(err)
        found.append(row)
    return found


def describe_plugins() -> list[dict[str, Any]]:
    """The installed plug-ins as :func:`mlbench.optim.descriptors.describe` has the built-ins, each
    with ``plugin``: its entry point, what it points to, its package, its source's SHA-256, or
    why it cannot be used (``error``)."""
    described = []
    for row in installed_plugins():
        source = {"entry_point": row["entry_point"], "value": row["value"],
                  "distribution": row["distribution"]}
        plugin: Plugin | None = row.get("plugin")
        if plugin is None:
            described.append({"name": row["entry_point"], "plugin": {**source, "error": row["error"]}})
        else:
            described.append({**describe(plugin.info), "closed_division": False,
                              "plugin": {**source, "origin": plugin.origin, "sha256": plugin.sha256}})
    return described


def load_recorded(run_dir: Path, record: dict[str, Any]) -> type[DistributedOptimizer]:
    """The class of the plug-in a run recorded, executed from the run folder's copy (a worker).

    The copy's SHA-256 must be the recorded one: a copy changed after the run was created would
    make the record lie about the code that ran.
    """
    label = plugin_label(str(record.get("name")), str(record.get("sha256")))
    path = Path(run_dir) / str(record["file"])
    try:
        source = path.read_bytes()
    except OSError as err:
        raise PluginError(f"optimizer plug-in {label}: the run's copy {path} cannot be read "
                          f"({err.strerror or err})") from None
    if hashlib.sha256(source).hexdigest() != record["sha256"]:
        raise PluginError(f"optimizer plug-in {label}: the run's copy {path} has changed since the run "
                          "was created (its SHA-256 is not the recorded one)")
    module = record.get("module")
    try:
        if module:
            loaded = _execute(source, str(path), module, _module_package(module))
        else:
            loaded = _execute(source, str(path), _file_module_name(path, record["sha256"]), None)
        return _plugin_class(loaded, str(record["class"]), str(record["spec"]), str(path))
    except UsageError as err:
        raise PluginError(str(err)) from None


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
            raise PluginError(f"optimizer plug-in {label} raised in step {count}: {_last_line(err)}") from err

    optimizer.step = step


def make_plugin(cls: type[DistributedOptimizer], ctx: Any, label: str) -> DistributedOptimizer:
    """``cls(ctx)`` with its ``step`` guarded; a failure while it is made is one line too."""
    try:
        optimizer = cls(ctx)
    except MlbenchError:
        raise
    except Exception as err:
        traceback.print_exc()
        raise PluginError(f"optimizer plug-in {label} failed to start: {_last_line(err)}") from err
    guard_steps(optimizer, label)
    return optimizer


# -- loading -------------------------------------------------------------------------------------
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _from_file(spec: str, path: Path, name: str) -> Plugin:
    try:
        source = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"optimizer plug-in {spec}: no such file {path}") from None
    except OSError as err:
        raise UsageError(f"optimizer plug-in {spec}: cannot read {path} ({err.strerror or err})") from None
    origin = str(path.resolve())
    module = _execute_checked(spec, source, origin, _file_module_name(path, hashlib.sha256(source).hexdigest()),
                              None)
    return Plugin(spec, "file", name, None, origin, source, _plugin_class(module, name, spec, str(path)))


def _from_module(spec: str, module_name: str, name: str, kind: str = "module",
                 distribution: str | None = None) -> Plugin:
    if not _MODULE.match(module_name) or not name.isidentifier():
        raise UsageError(f"optimizer plug-in {spec}: {module_name}:{name} is not package.module:CLASS")
    try:
        found = importlib.util.find_spec(module_name)
    except Exception as err:  # a parent package that is missing or fails to import
        raise UsageError(f"optimizer plug-in {spec}: module {module_name} cannot be found "
                         f"({_last_line(err)})") from None
    if found is None:
        raise UsageError(f"optimizer plug-in {spec}: no module named {module_name}")
    origin = found.origin
    if not origin or not origin.endswith(".py"):
        raise UsageError(f"optimizer plug-in {spec}: module {module_name} is not a Python source file "
                         f"({origin or 'no file'}); its source is what a run keeps")
    try:
        source = Path(origin).read_bytes()
    except OSError as err:
        raise UsageError(f"optimizer plug-in {spec}: cannot read {origin} ({err.strerror or err})") from None
    module = _execute_checked(spec, source, origin, module_name, _module_package(module_name))
    return Plugin(spec, kind, name, module_name, origin, source,
                  _plugin_class(module, name, spec, module_name), distribution)


def _module_package(module_name: str) -> str:
    return module_name.rpartition(".")[0]


def _file_module_name(path: Path, sha256: str) -> str:
    stem = re.sub(r"\W", "_", path.stem)
    return f"_mlbench_plugin_{stem}_{sha256[:SHORT_HASH]}"


def _execute_checked(spec: str, source: bytes, filename: str, module_name: str,
                     package: str | None) -> types.ModuleType:
    try:
        return _execute(source, filename, module_name, package)
    except UsageError:
        raise
    except (Exception, SystemExit) as err:
        raise UsageError(f"optimizer plug-in {spec}: importing it failed: {_last_line(err, filename)}") from None


def _execute(source: bytes, filename: str, module_name: str, package: str | None) -> types.ModuleType:
    """Run ``source`` as the module ``module_name`` (registered in sys.modules while and after it
    runs, as an import would: dataclasses and pickling look classes up there)."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    module.__package__ = package or ""
    module.__spec__ = importlib.util.spec_from_loader(module_name, None, origin=filename)
    code = compile(source, filename, "exec")
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        if previous is not None:
            sys.modules[module_name] = previous
        else:
            sys.modules.pop(module_name, None)
        raise
    return module


def _plugin_class(module: types.ModuleType, name: str, spec: str, where: str) -> type[DistributedOptimizer]:
    """``module.name``, checked to be a usable optimizer class, or a UsageError saying why not."""
    obj = getattr(module, name, None)
    if obj is None:
        raise UsageError(f"optimizer plug-in {spec}: {where} defines no {name}")
    base = sys.modules.get("mlbench.optim.base")  # not imported: nothing can subclass it
    if not isinstance(obj, type) or base is None or not issubclass(obj, base.DistributedOptimizer):
        raise UsageError(f"optimizer plug-in {spec}: {name} is not a subclass of "
                         "mlbench.optim.base.DistributedOptimizer")
    cls = cast("type[DistributedOptimizer]", obj)
    info = getattr(cls, "info", None)
    if not isinstance(info, OptimizerInfo):
        raise UsageError(f"optimizer plug-in {spec}: {name} has no `info = OptimizerInfo(...)` "
                         "(mlbench.optim.descriptors) saying its name and options")
    if is_builtin(info.name):
        raise UsageError(f"optimizer plug-in {spec}: {name} calls itself {info.name}, a built-in "
                         "optimizer's name; give its info a name of its own")
    if not _NAME.match(info.name):
        raise UsageError(f"optimizer plug-in {spec}: its name {info.name!r} must be 1-64 letters, digits, "
                         "'-', '_' or '.'")
    if cls.step is base.DistributedOptimizer.step:
        raise UsageError(f"optimizer plug-in {spec}: {name} does not implement step(lr)")
    return cls


def _last_line(err: BaseException, filename: str | None = None) -> str:
    """The exception's own line (``ValueError: boom``), with the plug-in's line it came from."""
    text = traceback.format_exception_only(type(err), err)[-1].strip() or type(err).__name__
    if isinstance(err, SyntaxError) and err.lineno:
        return f"{text} (line {err.lineno})"
    if filename is not None:
        lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__) if frame.filename == filename]
        if lines:
            return f"{text} (line {lines[-1]})"
    return text
