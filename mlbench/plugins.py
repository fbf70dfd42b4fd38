"""Plug-ins of any kind (optimizers, models): where their source comes from, how a run keeps it,
how a worker executes the kept copy.

A plug-in is named as ``FILE.py:NAME``, ``package.module:NAME`` or the name of an entry point in
a group of its kind (``mlbench.optimizers``, ``mlbench.models``). Why the source, not the import,
is what counts: every worker of a run must run the same code, on whatever machine it runs, and
a result must say which code made it. So the CLI reads the plug-in's source file once and
executes it (:func:`load`), the run keeps those bytes (``RUN/plugin/<file>.py``) with their
SHA-256 in run.json, and the workers execute that copy (:func:`load_copy`), never the user's
path, so that an edit after ``mlbench run`` changes nothing. A module plug-in travels as its one
file: what it imports comes from the workers' environment.

This module knows nothing of what a plug-in must be: each kind checks the object it gets
(:mod:`mlbench.optim.plugins`, :mod:`mlbench.tasks.models.plugins`). It imports neither torch
nor any other layer, so that both kinds can use it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import stat
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlbench.errors import MlbenchError, UsageError

#: The folder of a run that holds its plug-ins' sources.
PLUGIN_DIR = "plugin"
#: The hex digits of the SHA-256 that name a plug-in's source in tables (``my-sgd@1a2b3c4d5e6f``).
SHORT_HASH = 12

T = TypeVar("T")

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginError(MlbenchError):
    """A plug-in failed in a worker (its copy is unreadable, it raised while made or used)."""


@dataclass(frozen=True)
class Loaded:
    """A plug-in's source as read and executed: where from, the bytes, the object it names
    (None when the module defines no such name: the kind says so in its words)."""

    spec: str                 # as the user gave it
    kind: str                 # "file", "module" or "entry-point"
    attr: str                 # the name the spec gives inside the module
    module: str | None        # the module's import name (module and entry-point plug-ins)
    origin: str               # the source file it was read from
    where: str                # how errors name the module: the path as given, or the module
    source: bytes
    obj: Any
    distribution: str | None = None  # an entry point's package, "name version"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source).hexdigest()

    @property
    def copy_path(self) -> str:
        """Where the run folder keeps the source, relative to it (also a valid ConfigMap key)."""
        stem = self.module if self.module else Path(self.origin).stem
        return f"{PLUGIN_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}.py"

    def source_record(self) -> dict[str, Any]:
        """What run.json says of any plug-in's source: enough for a worker to load the copy and
        for a reader to know exactly which code ran; each kind adds its own keys."""
        return {"spec": self.spec, "kind": self.kind, "module": self.module, "origin": self.origin,
                "distribution": self.distribution, "file": self.copy_path, "sha256": self.sha256}


def plugin_label(name: str, sha256: str) -> str:
    """``name@1a2b3c4d5e6f``: what names a plug-in everywhere, so that two sources never pass for one."""
    return f"{name}@{sha256[:SHORT_HASH]}"


def is_plugin_label(value: str | None) -> bool:
    """Whether a run's optimizer or model (as the catalog or the spec has it) is a plug-in's ``name@sha``."""
    return bool(value) and "@" in str(value)


def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=group)}


def distribution_of(entry: importlib.metadata.EntryPoint) -> str | None:
    dist = entry.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else None


def load(spec: str, *, noun: str, group: str, unknown: Callable[[], str]) -> Loaded:
    """The plug-in ``spec`` names, its source read and executed, or a UsageError in one line
    starting with ``noun`` (no such file, module or entry point; an import that fails).
    ``unknown()`` is the sentence for a bare name that is no entry point of ``group``."""
    if ":" in spec:
        where, _, name = spec.rpartition(":")
        if not where or not name.isidentifier():
            raise UsageError(f"{noun} {spec}: give FILE.py:NAME or package.module:NAME")
        if where.endswith(".py") or "/" in where or "\\" in where:
            return _from_file(spec, noun, Path(where).expanduser(), name)
        return _from_module(spec, noun, where, name)
    entry = entry_points(group).get(spec)
    if entry is None:
        raise UsageError(unknown())
    module, _, attr = entry.value.partition(":")
    return _from_module(spec, noun, module.strip(), attr.strip(), kind="entry-point",
                        distribution=distribution_of(entry))


def source_of(module_name: str) -> Path:
    """The source file of module ``module_name``, found as the import system would find it, but
    without executing it or any package above it (``importlib.util.find_spec`` imports the
    parents): each meta-path finder (the path finder, an editable install's) asked level by
    level. LookupError, in words, when there is none."""
    if not _MODULE.match(module_name):
        raise LookupError(f"{module_name} is not a module name")
    search: list[str] | None = None
    spec = None
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        for finder in sys.meta_path if spec is None else ():
            find = getattr(finder, "find_spec", None)
            if find is not None and (spec := find(name, search)) is not None:
                break
        if spec is None:
            raise LookupError(f"no module named {name}")
        if depth < len(parts):
            search = list(spec.submodule_search_locations or [])
            if not search:
                raise LookupError(f"{name} is not a package")
    assert spec is not None
    if not spec.origin or not spec.origin.endswith(".py"):
        raise LookupError(f"module {module_name} is not a Python source file ({spec.origin or 'no file'})")
    return Path(spec.origin)


def installed(group: str, builtin: Callable[[str], bool], noun: str) -> list[dict[str, Any]]:
    """Every entry point in ``group``: its name, where it points, its package, and its source
    file and that file's SHA-256, found without importing anything (listing the installed
    plug-ins runs none of their code: a plug-in runs when a run, or the user by name, asks for
    it); or why it cannot be used (``error``) as far as that shows without running it."""
    found = []
    for name, entry in sorted(entry_points(group).items()):
        row: dict[str, Any] = {"entry_point": name, "value": entry.value, "distribution": distribution_of(entry)}
        module, _, attr = entry.value.partition(":")
        if builtin(name):
            row["error"] = f"a built-in {noun} is called {name}; the built-in is used"
        elif not attr.strip().isidentifier():
            row["error"] = f"{entry.value} is not package.module:NAME"
        else:
            try:
                origin = source_of(module.strip())
                row.update(origin=str(origin), sha256=hashlib.sha256(read_source(origin, f"{noun} {name}")).hexdigest())
            except (LookupError, OSError, UsageError) as err:
                row["error"] = str(err)
        found.append(row)
    return found


def load_copy(run_dir: Path, record: dict[str, Any], noun: str, attr: str,
              check: Callable[[Any, str, str, str], T]) -> T:
    """The object ``attr`` of a run's plug-in, executed from the run folder's copy (a worker), as
    ``check(obj, attr, spec, where)`` accepts it (the kind's own check, as the CLI ran it; obj is
    None when the copy defines no such name).

    The copy's SHA-256 must be the recorded one: a copy changed after the run was created would
    make the record lie about the code that ran. Failures are :class:`PluginError` in one line.
    """
    label = plugin_label(str(record.get("name")), str(record.get("sha256")))
    path = Path(run_dir) / str(record["file"])
    try:
        source = path.read_bytes()
    except OSError as err:
        raise PluginError(f"{noun} {label}: the run's copy {path} cannot be read ({err.strerror or err})") from None
    if hashlib.sha256(source).hexdigest() != record["sha256"]:
        raise PluginError(f"{noun} {label}: the run's copy {path} has changed since the run was created "
                          "(its SHA-256 is not the recorded one)")
    module = record.get("module")
    try:
        if module:
            loaded = execute(source, str(path), module, _module_package(module))
        else:
            loaded = execute(source, str(path), file_module_name(path, record["sha256"]), None)
    except (Exception, SystemExit) as err:
        traceback.print_exc()
        raise PluginError(f"{noun} {label}: importing the run's copy failed: {last_line(err, str(path))}") from None
    try:
        return check(getattr(loaded, attr, None), attr, str(record["spec"]), str(path))
    except UsageError as err:
        raise PluginError(str(err)) from None


# -- loading -------------------------------------------------------------------------------------
def read_source(path: Path, what: str) -> bytes:
    """A plug-in's source, read only from a regular file: a FIFO would block the reader until
    some process wrote to it (the CLI waiting for ever), a device could be endless. The file is
    opened without blocking and checked before anything is read; ``what`` starts the error."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{what}: {path} is not a regular file (a FIFO, a device or a folder); give the "
                             "plug-in's .py file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def _from_file(spec: str, noun: str, path: Path, name: str) -> Loaded:
    try:
        source = read_source(path, f"{noun} {spec}")
    except FileNotFoundError:
        raise UsageError(f"{noun} {spec}: no such file {path}") from None
    except OSError as err:
        raise UsageError(f"{noun} {spec}: cannot read {path} ({err.strerror or err})") from None
    origin = str(path.resolve())
    module = _execute_checked(spec, noun, source, origin, file_module_name(path, hashlib.sha256(source).hexdigest()),
                              None)
    return Loaded(spec, "file", name, None, origin, str(path), source, getattr(module, name, None))


def _from_module(spec: str, noun: str, module_name: str, name: str, kind: str = "module",
                 distribution: str | None = None) -> Loaded:
    if not _MODULE.match(module_name) or not name.isidentifier():
        raise UsageError(f"{noun} {spec}: {module_name}:{name} is not package.module:NAME")
    try:
        found = importlib.util.find_spec(module_name)
    except Exception as err:  # a parent package that is missing or fails to import
        raise UsageError(f"{noun} {spec}: module {module_name} cannot be found ({last_line(err)})") from None
    if found is None:
        raise UsageError(f"{noun} {spec}: no module named {module_name}")
    origin = found.origin
    if not origin or not origin.endswith(".py"):
        raise UsageError(f"{noun} {spec}: module {module_name} is not a Python source file "
                         f"({origin or 'no file'}); its source is what a run keeps")
    try:
        source = read_source(Path(origin), f"{noun} {spec}")
    except OSError as err:
        raise UsageError(f"{noun} {spec}: cannot read {origin} ({err.strerror or err})") from None
    module = _execute_checked(spec, noun, source, origin, module_name, _module_package(module_name))
    return Loaded(spec, kind, name, module_name, origin, module_name, source, getattr(module, name, None),
                  distribution)


def _module_package(module_name: str) -> str:
    return module_name.rpartition(".")[0]


def file_module_name(path: Path, sha256: str) -> str:
    """The name a file plug-in's module has in sys.modules: its stem and hash, so that two
    sources of one name never replace each other."""
    stem = re.sub(r"\W", "_", path.stem)
    return f"_mlbench_plugin_{stem}_{sha256[:SHORT_HASH]}"


def _execute_checked(spec: str, noun: str, source: bytes, filename: str, module_name: str,
                     package: str | None) -> types.ModuleType:
    try:
        return execute(source, filename, module_name, package)
    except UsageError:
        raise
    except (Exception, SystemExit) as err:
        raise UsageError(f"{noun} {spec}: importing it failed: {last_line(err, filename)}") from None


def execute(source: bytes, filename: str, module_name: str, package: str | None) -> types.ModuleType:
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


def last_line(err: BaseException, filename: str | None = None) -> str:
    """The exception's own line (``ValueError: boom``), with the plug-in's line it came from."""
    text = traceback.format_exception_only(type(err), err)[-1].strip() or type(err).__name__
    if isinstance(err, SyntaxError) and err.lineno:
        return f"{text} (line {err.lineno})"
    if filename is not None:
        lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__) if frame.filename == filename]
        if lines:
            return f"{text} (line {lines[-1]})"
    return text
