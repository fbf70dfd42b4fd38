"""The launchers, by the name a run records: the one door through which the CLI, the dashboard,
benchmarks and tests reach runs.

A launcher is one module with one :class:`~mlbench.launch.base.Launcher` class, registered here
by name (as torchx registers its schedulers); it is imported the first time it is needed. The
class declares everything else mlbench asks of it (its `mlbench run` options, how it is chosen,
the machines a run occupies, its network), so adding a launcher is adding its module and its line
below. :func:`choose` picks the launcher of new runs from the options of `mlbench run`;
:func:`launcher_of` the launcher of a recorded run, for every later request (status, cancel,
delete, logs, the dashboard).

MPI is not a launcher of its own but a backend (``--backend mpi``) that the local and Slurm
launchers start with ``mpirun`` (:mod:`mlbench.launch.mpi`); its runs record ``local`` or
``slurm`` and are cancelled and reconciled as such.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from mlbench.errors import UsageError
from mlbench.launch.base import Launcher, LauncherOption, LaunchSettings, Progress, quiet
from mlbench.results.store import RunRecord, RunStore

#: Every launcher: the name its runs record, and its class as ``module:Class``.
LAUNCHERS: dict[str, str] = {
    "local": "mlbench.launch.local:LocalLauncher",
    "slurm": "mlbench.launch.slurm:SlurmLauncher",
    "external": "mlbench.launch.external:ExternalLauncher",
    "kubernetes": "mlbench.launch.kubernetes:KubernetesLauncher",
}
#: The launcher of `mlbench run` when no option or store chooses another.
DEFAULT = "local"


@functools.cache
def launcher_class(name: str) -> type[Launcher]:
    """The class of launcher ``name``, imported on first use."""
    try:
        module, _, attribute = LAUNCHERS[name].partition(":")
    except KeyError:
        raise UsageError(f"unknown launcher {name!r}; mlbench has {', '.join(LAUNCHERS)}") from None
    cls = getattr(importlib.import_module(module), attribute)
    assert issubclass(cls, Launcher) and cls.name == name, f"{LAUNCHERS[name]} is launcher {name!r}"
    return cls


def launcher_classes() -> list[type[Launcher]]:
    """Every launcher class, in registration order."""
    return [launcher_class(name) for name in LAUNCHERS]


def launcher_options() -> list[LauncherOption]:
    """Every launcher's `mlbench run` options, the one that chooses it first, in registration
    order (what the CLI adds to `mlbench run` and what ``launch=`` of the API may hold)."""
    options: list[LauncherOption] = []
    for cls in launcher_classes():
        options += [*([cls.choose_option] if cls.choose_option else []), *cls.options]
    return options


def _given(value: Any) -> bool:
    return value not in (None, False, (), [], "")


def choose(store: RunStore, values: dict[str, Any], progress: Progress = quiet) -> Launcher:
    """The launcher of new runs in ``store`` that `mlbench run`'s launcher option ``values`` (by
    :attr:`LauncherOption.name`) ask for; a usage error for options that contradict each other
    or belong to a launcher that was not chosen. Its own option values are checked here, before
    any run exists."""
    chosen = [cls for cls in launcher_classes() if cls.chosen(store, values)]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(cls.chosen_by() for cls in chosen)} choose different launchers "
                         f"({', '.join(cls.name for cls in chosen)}): choose one")
    cls = chosen[0] if chosen else launcher_class(DEFAULT)
    if not cls.serves(store):
        other = next(c for c in launcher_classes() if c.serves(store))
        raise UsageError(f"{cls.label} runs cannot be kept in this run store; {other.chosen_by()} "
                         "chooses it")
    for other in launcher_classes():
        for option in other.options if other is not cls else ():
            if _given(values.get(option.name)):
                raise UsageError(f"{option.flag} is an option of {other.label} runs; {other.how_to_choose}")
    launcher = cls(store, LaunchSettings({o.name: values.get(o.name) for o in cls.options}, progress))
    launcher.check_options()
    return launcher


def launcher_of(store: RunStore, record: RunRecord) -> Launcher:
    """The launcher of a recorded run (the one that created it), over ``store``. A run of a
    launcher that is not registered any more is read by the launcher of its store."""
    cls = launcher_class(record.launcher) if record.launcher in LAUNCHERS else None
    if cls is None or not cls.serves(store):
        cls = next(c for c in launcher_classes() if c.serves(store))
    return cls(store)
