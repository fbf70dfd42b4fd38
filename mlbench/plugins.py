"""Plug-ins of any kind (optimizers, models): where their code comes from, how a run keeps it,
how a worker executes the kept copy.

A plug-in is named as ``FILE.py:NAME``, ``package.module:NAME`` or the name of an entry point in
a group of its kind (``mlbench.optimizers``, ``mlbench.models``). Why the code, not the import,
is what counts: every worker of a run must run the same code, on whatever machine it runs, and
a result must say which code made it. So the CLI reads the plug-in's source once and executes it
(:func:`load`), noting every module it imports and every file it opens from its own folder (a
file plug-in's folder, a module's top-level package): that is the plug-in's **bundle**
(:class:`Bundle`). The run keeps those bytes (``RUN/plugin/<name>/...``) with their SHA-256s in
run.json, and the workers execute that copy (:func:`load_copy`) with its folder first on
``sys.path``, never the user's path: an edit after ``mlbench run`` changes nothing, a helper
module's edit makes a new hash, and ``__file__`` lies inside the copy.

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
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mlbench.errors import MlbenchError, UsageError

#: The folder of a run that holds its plug-ins' sources.
PLUGIN_DIR = "plugin"
#: The hex digits of the SHA-256 that name a plug-in's source in tables (``my-sgd@1a2b3c4d5e6f``).
SHORT_HASH = 12
#: The most bytes a plug-in's files may hold together: every run keeps a copy of them.
BUNDLE_LIMIT = 16 * 1024 * 1024
#: The most files a plug-in's bundle may have.
BUNDLE_FILES = 256

T = TypeVar("T")

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PluginError(MlbenchError):
    """A plug-in failed in a worker (its copy is unreadable, it raised while made or used)."""


@dataclass(frozen=True)
class Bundle:
    """All of a plug-in's own code and data: its files by their path relative to ``root`` (the
    file plug-in's folder, or the folder that holds a module's top-level package), the entry
    module's file first. One file's SHA-256 is that file's; several files' is the SHA-256 of
    their sorted ``path NUL sha256 LF`` lines, so that an edit to any of them, or a file added,
    makes another hash. ``modules`` are the import names of the bundle's modules other than
    the entry: a worker forgets any module of those names before it runs the copy."""

    root: str
    files: tuple[tuple[str, bytes], ...]
    modules: tuple[str, ...] = ()

    @property
    def entry(self) -> str:
        return self.files[0][0]

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.files)

    @property
    def hashes(self) -> dict[str, str]:
        return {relative: hashlib.sha256(data).hexdigest() for relative, data in self.files}

    @property
    def sha256(self) -> str:
        return bundle_sha256(self.hashes)


def bundle_sha256(hashes: dict[str, str]) -> str:
    """The SHA-256 that names a bundle of files (``{relative path: its SHA-256}``): see :class:`Bundle`."""
    if len(hashes) == 1:
        return next(iter(hashes.values()))
    return hashlib.sha256("".join(f"{path}\0{sha}\n" for path, sha in sorted(hashes.items())).encode()).hexdigest()


@dataclass(frozen=True)
class Loaded:
    """A plug-in's code as read and executed: where from, its bundle, the object it names
    (None when the module defines no such name: the kind says so in its words)."""

    spec: str                 # as the user gave it
    kind: str                 # "file", "module" or "entry-point"
    attr: str                 # the name the spec gives inside the module
    module: str | None        # the module's import name (module and entry-point plug-ins)
    origin: str               # the entry module's source file
    where: str                # how errors name the module: the path as given, or the module
    bundle: Bundle
    obj: Any
    distribution: str | None = None  # the installed package it comes from, "name version"

    @property
    def source(self) -> bytes:
        """The entry module's source."""
        return self.bundle.files[0][1]

    @property
    def sha256(self) -> str:
        return self.bundle.sha256

    @property
    def copy_dir(self) -> str:
        """The run folder's folder for the bundle, relative to the run folder."""
        stem = self.module if self.module else Path(self.origin).stem
        return f"{PLUGIN_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}"

    @property
    def copy_path(self) -> str:
        """Where the run folder keeps the entry module, relative to it."""
        return f"{self.copy_dir}/{self.bundle.entry}"

    def copies(self) -> dict[str, bytes]:
        """Every file of the bundle by its path in the run folder."""
        return {f"{self.copy_dir}/{relative}": data for relative, data in self.bundle.files}

    def source_record(self) -> dict[str, Any]:
        """What run.json says of any plug-in's code: enough for a worker to load the copy and
        for a reader to know exactly which code ran; each kind adds its own keys."""
        return {"spec": self.spec, "kind": self.kind, "module": self.module, "origin": self.origin,
                "distribution": self.distribution, "root": self.bundle.root, "folder": self.copy_dir,
                "file": self.copy_path, "files": self.bundle.hashes, "modules": list(self.bundle.modules),
                "sha256": self.sha256}


def recorded_files(record: dict[str, Any]) -> list[str]:
    """The run folder's paths of a recorded plug-in's files (one for a run of before bundles)."""
    if "files" not in record:
        return [str(record["file"])]
    return [f"{record['folder']}/{relative}" for relative in record["files"]]


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
                sha256 = _static_sha256(origin.resolve(), module.strip(), f"{noun} {name}")
                row.update(origin=str(origin), sha256=sha256)
            except (LookupError, OSError, UsageError) as err:
                row["error"] = str(err)
        found.append(row)
    return found


def _static_sha256(entry: Path, module_name: str, what: str) -> str:
    """The hash of what a module plug-in's bundle holds whatever it imports (its file and its
    packages' ``__init__.py``), found without executing it: a run's hash is this one unless the
    module imports or opens more of its package's files."""
    _, base, chain = _module_layout(entry, module_name)
    return bundle_sha256({path.relative_to(base).as_posix(): hashlib.sha256(read_source(path, what)).hexdigest()
                          for path in [entry, *chain]})


def load_copy(run_dir: Path, record: dict[str, Any], noun: str, attr: str,
              check: Callable[[Any, str, str, str], T]) -> T:
    """The object ``attr`` of a run's plug-in, executed from the run folder's copy (a worker), as
    ``check(obj, attr, spec, where)`` accepts it (the kind's own check, as the CLI ran it; obj is
    None when the copy defines no such name).

    Every file of the copy must have its recorded SHA-256: a copy changed after the run was
    created would make the record lie about the code that ran. The copy's folder goes first on
    ``sys.path`` and the bundle's modules are forgotten first, so that its imports find the copy's
    helpers, never the user's. Failures are :class:`PluginError` in one line.
    """
    label = plugin_label(str(record.get("name")), str(record.get("sha256")))
    hashes = record.get("files") or {}
    folder = Path(run_dir) / str(record.get("folder", PLUGIN_DIR))
    path = Path(run_dir) / str(record["file"])
    try:
        source = path.read_bytes()
        found = {relative: hashlib.sha256((folder / relative).read_bytes()).hexdigest() for relative in hashes}
    except OSError as err:
        missing = err.filename or path
        raise PluginError(f"{noun} {label}: the run's copy {missing} cannot be read ({err.strerror or err})") from None
    changed = [relative for relative, sha in hashes.items() if found[relative] != sha]
    if changed or (hashes and bundle_sha256(found) != record["sha256"]) \
            or (not hashes and hashlib.sha256(source).hexdigest() != record["sha256"]):
        what = f"{folder / changed[0]}" if changed else str(path)
        raise PluginError(f"{noun} {label}: the run's copy {what} has changed since the run was created "
                          "(its SHA-256 is not the recorded one)")
    module = record.get("module")
    if hashes:
        for name in record.get("modules") or ():
            sys.modules.pop(name, None)
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    entry_sha = hashlib.sha256(source).hexdigest()
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True   # the copy stays what was hashed
    try:
        if module:
            loaded = execute(source, str(path), module, _module_package(module))
        else:
            loaded = execute(source, str(path), file_module_name(path, entry_sha), None)
    except (Exception, SystemExit) as err:
        traceback.print_exc()
        raise PluginError(f"{noun} {label}: importing the run's copy failed: {last_line(err, str(path))}") from None
    finally:
        sys.dont_write_bytecode = writes
    try:
        return check(getattr(loaded, attr, None), attr, str(record["spec"]), str(path))
    except UsageError as err:
        raise PluginError(str(err)) from None


# -- what a plug-in brings: its bundle --------------------------------------------------------------
@dataclass
class _Trace:
    """What executing a plug-in did within ``folder``: the modules it imported (found in
    sys.modules afterwards) and the files it opened for reading (seen by the audit hook)."""

    folder: Path
    before: set[str]
    foreign: list[Path]       # sys.path entries inside ``folder`` before the plug-in ran
    opened: list[str] = field(default_factory=list)


_ACTIVE = threading.local()          # the traces of this thread, innermost last
_HOOKED: list[bool] = []             # whether :func:`_audit` is installed (it cannot be removed)
#: Import names of the helper modules of bundles loaded in this process: forgotten before a
#: plug-in is executed again, so that an edit since is executed, and traced, again.
_BUNDLED: set[str] = set()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Notes a file opened for reading while a plug-in executes (``open`` and ``os.open`` raise
    the ``open`` audit event with the path, the mode and the flags)."""
    if event != "open":
        return
    traces = getattr(_ACTIVE, "traces", None)
    if not traces or not args or isinstance(args[0], int):
        return
    path, mode, flags = (tuple(args) + (None, None))[:3]
    if isinstance(mode, str):
        if any(c in mode for c in "wax+"):
            return
    elif isinstance(flags, int) and flags & os.O_ACCMODE != os.O_RDONLY:
        return
    try:
        traces[-1].opened.append(os.path.abspath(os.fsdecode(path)))
    except (TypeError, ValueError):
        pass


def _forget_bundled() -> set[str]:
    """Forget the helper modules of bundles executed before (see :data:`_BUNDLED`); the
    modules imported now, from which a trace counts what is imported after."""
    for name in _BUNDLED:
        sys.modules.pop(name, None)
    return set(sys.modules)


@contextmanager
def _tracing(folder: Path, on_path: Path | None, before: set[str]) -> Iterator[_Trace]:
    """Trace what runs inside the block does within ``folder``, counting the modules imported
    since ``before`` (:func:`_forget_bundled`); ``on_path`` goes first on sys.path meanwhile (a
    file plug-in's folder, as ``python FILE.py`` would put it)."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    trace = _Trace(folder, before, _foreign_folders(folder))
    traces = _ACTIVE.__dict__.setdefault("traces", [])
    traces.append(trace)
    path = list(sys.path)
    if on_path is not None and str(on_path) not in sys.path:
        sys.path.insert(0, str(on_path))
    try:
        yield trace
    finally:
        traces.remove(trace)
        sys.path[:] = path   # what the plug-in added is its own workers' business, not the CLI's


def _inside(path: Path, folder: Path) -> bool:
    try:
        relative = path.relative_to(folder)
    except ValueError:
        return False
    return not any(part.startswith(".") or part == "__pycache__" for part in relative.parts)


def _foreign_folders(folder: Path) -> list[Path]:
    """Folders inside ``folder`` that hold other installed code (a virtual environment's
    site-packages, another sys.path entry before the plug-in runs): what is imported or opened
    from there is not the plug-in's own."""
    inner = []
    for entry in sys.path:
        try:
            path = Path(entry or ".").resolve()
        except OSError:
            continue
        if path != folder and _inside(path, folder):
            inner.append(path)
    return inner


def _installed_elsewhere(top: str) -> bool:
    """Whether the top-level module ``top`` belongs to an installed distribution (mlbench, a
    library): code that a file plug-in's folder happens to hold, not the plug-in's."""
    if top == "mlbench":
        return True
    try:
        return top in importlib.metadata.packages_distributions()
    except Exception:   # a broken distribution's metadata must not stop a plug-in
        return False


def _bundle(spec: str, noun: str, trace: _Trace, base: Path, entry: Path, entry_source: bytes,
            chain: list[Path], own_package: str | None) -> Bundle:
    """The bundle that ``trace`` saw: the entry module's file, each ``chain`` file (the
    ``__init__.py`` of the entry's packages, executed with it whether imported before or not),
    the modules imported and files opened within the traced folder, by their path relative to
    ``base``; a UsageError when they are too many or too large to keep with every run."""
    folder = trace.folder

    def own(path: Path) -> bool:
        return _inside(path, folder) and not any(_inside(path, other) for other in trace.foreign)

    found: dict[Path, None] = dict.fromkeys(chain)
    modules = []
    for name in sorted(set(sys.modules) - trace.before):
        module = sys.modules.get(name)
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or getattr(module, "__file__", None)
        if not origin or not str(origin).endswith(".py"):
            continue
        path = Path(origin).resolve()
        top = name.partition(".")[0]
        if path == entry or not own(path) or (top != own_package and _installed_elsewhere(top)):
            continue
        found[path] = None
        modules.append(name)
    for opened in trace.opened:
        path = Path(opened).resolve()
        if path != entry and own(path) and path.is_file():
            found[path] = None
    files = [(entry.relative_to(base).as_posix(), entry_source)]
    for path in found:
        if path == entry:
            continue
        try:
            files.append((path.relative_to(base).as_posix(), read_source(path, f"{noun} {spec}")))
        except OSError as err:
            raise UsageError(f"{noun} {spec}: cannot read its file {path} ({err.strerror or err})") from None
    bundle = Bundle(str(base), tuple(files), tuple(modules))
    if len(files) > BUNDLE_FILES or bundle.size > BUNDLE_LIMIT:
        largest = ", ".join(f"{rel} ({len(data):,} B)" for rel, data in sorted(files, key=lambda f: -len(f[1]))[:3])
        raise UsageError(f"{noun} {spec}: it imports or opens {len(files)} files of {bundle.size:,} bytes from "
                         f"{folder}, more than a run keeps ({BUNDLE_FILES} files, {BUNDLE_LIMIT:,} bytes; "
                         f"largest: {largest}); give the plug-in a folder of its own")
    _BUNDLED.update(modules)
    return bundle


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
    entry = path.resolve()
    module_name = file_module_name(path, hashlib.sha256(source).hexdigest())
    with _tracing(entry.parent, on_path=entry.parent, before=_forget_bundled()) as trace:
        module = _execute_checked(spec, noun, source, str(entry), module_name, None)
    bundle = _bundle(spec, noun, trace, entry.parent, entry, source, [], None)
    return Loaded(spec, "file", name, None, str(entry), str(path), bundle, getattr(module, name, None))


def _from_module(spec: str, noun: str, module_name: str, name: str, kind: str = "module",
                 distribution: str | None = None) -> Loaded:
    if not _MODULE.match(module_name) or not name.isidentifier():
        raise UsageError(f"{noun} {spec}: {module_name}:{name} is not package.module:NAME")
    before = _forget_bundled()   # find_spec imports the packages above: they count
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
    entry = Path(origin).resolve()
    top = module_name.partition(".")[0]
    package, base, chain = _module_layout(entry, module_name)
    # a top-level module in a folder of installed code (site-packages) travels as its one file
    folder = package if package is not None else (entry.parent if not _is_site_folder(entry.parent) else entry)
    with _tracing(folder, on_path=None, before=before) as trace:
        module = _execute_checked(spec, noun, source, origin, module_name, _module_package(module_name))
    bundle = _bundle(spec, noun, trace, base, entry, source, chain, top)
    return Loaded(spec, kind, name, module_name, origin, module_name, bundle, getattr(module, name, None),
                  distribution or _distribution_of_module(top))


def _module_layout(entry: Path, module_name: str) -> tuple[Path | None, Path, list[Path]]:
    """Where module ``module_name`` (its file ``entry``) lies: its top-level package's folder
    (None for a top-level module), the folder its bundle's paths are relative to, and the
    ``__init__.py`` of each package above it (executed with it, imported before or not)."""
    depth = module_name.count(".")
    package = entry.parents[depth - 1] if depth else None
    base = package.parent if package is not None else entry.parent
    chain = [entry.parents[level] / "__init__.py" for level in range(depth)]
    return package, base, [path for path in chain if path.is_file()]


def _is_site_folder(folder: Path) -> bool:
    """A folder of installed packages, whose other modules are not a top-level module's own."""
    import site
    import sysconfig

    sites = {*site.getsitepackages(), site.getusersitepackages(), *sysconfig.get_paths().values()}
    return folder.name in ("site-packages", "dist-packages") or str(folder) in sites


def _distribution_of_module(top: str) -> str | None:
    """The installed distribution that provides the top-level package ``top``, "name version"."""
    try:
        names = importlib.metadata.packages_distributions().get(top) or []
        return f"{names[0]} {importlib.metadata.version(names[0])}" if names else None
    except Exception:   # metadata that cannot be read: no distribution recorded, as for a folder
        return None


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
