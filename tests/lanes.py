"""The unit lane: the modules whose tests start no process (``pytest -m unit``).

The full suite starts real workers, CLIs, servers and clusters. The unit lane is the part that
runs inside the test process alone, for a quick check while working. Its modules are listed in
:data:`UNIT_MODULES`; conftest marks their tests ``unit``. In the lane (``-m unit``), or wherever
``MLBENCH_TEST_NO_PROCESSES=1`` is set, :func:`forbid_processes` makes every way of starting a
process raise, so a module that starts one fails at once instead of making the lane slow: that
keeps the list true, and the same switch over the whole suite finds the modules that qualify.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: Modules whose every test runs in the test process (checked by :func:`forbid_processes`).
UNIT_MODULES: tuple[str, ...] = (
    "tests/cloud/test_config.py",
    "tests/cloud/test_help.py",
    "tests/cloud/test_pricing.py",
    "tests/dashboard/test_form.py",
    "tests/frameworks/test_data_order.py",
    "tests/frameworks/test_framework_features.py",
    "tests/frameworks/test_scoring.py",
    "tests/frameworks/test_step_runs.py",
    "tests/gpt/test_data_cli.py",
    "tests/gpt/test_model.py",
    "tests/gpt/test_shards.py",
    "tests/language/test_data.py",
    "tests/language/test_models.py",
    "tests/language/test_training_pieces.py",
    "tests/optim/test_hyper.py",
    "tests/optim/test_optim_knows_no_task.py",
    "tests/results/test_charts.py",
    "tests/results/test_cli_results.py",
    "tests/results/test_compare.py",
    "tests/results/test_cost.py",
    "tests/results/test_division_and_fairness.py",
    "tests/results/test_environment.py",
    "tests/results/test_events.py",
    "tests/results/test_families.py",
    "tests/results/test_link_down.py",
    "tests/results/test_rank_curves.py",
    "tests/results/test_repeat_stats.py",
    "tests/results/test_repeats.py",
    "tests/results/test_result_model.py",
    "tests/results/test_safe_writes.py",
    "tests/server/test_service_hardening.py",
    "tests/test_cli_reference.py",
    "tests/test_data_cifar10.py",
    "tests/test_docs.py",
    "tests/test_fast_steps.py",
    "tests/test_layers.py",
    "tests/test_models.py",
    "tests/test_predict.py",
    "tests/test_progress.py",
    "tests/test_results_client.py",
    "tests/test_resume_exact.py",
    "tests/test_run_path.py",
    "tests/test_scheduling.py",
    "tests/test_sharding.py",
    "tests/test_spec.py",
    "tests/test_task_records.py",
    "tests/test_trainer_loop.py",
)

#: Set to 1: processes are forbidden whatever the marker expression (to find unit modules).
NO_PROCESSES_ENV = "MLBENCH_TEST_NO_PROCESSES"


class ProcessForbidden(RuntimeError):
    """A test of the unit lane tried to start a process."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ProcessForbidden(f"the unit lane starts no process, and this test called {what}: "
                               "take its module out of tests/lanes.py's UNIT_MODULES")
    return refuse


def forbid_processes() -> None:
    """Make forking, spawning and exec-ing a new process raise :class:`ProcessForbidden` in this
    process: subprocess, multiprocessing (every start method: fork, or _posixsubprocess's
    fork_exec for spawn and forkserver), os.system and os.posix_spawn."""
    import _posixsubprocess
    import subprocess

    _posixsubprocess.fork_exec = _refuse("fork_exec (multiprocessing)")  # type: ignore[attr-defined]
    subprocess._fork_exec = _refuse("subprocess")  # type: ignore[attr-defined]   # its own reference
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name}"))


def in_unit_lane(markexpr: str) -> bool:
    """Whether this session is the unit lane (or was asked to forbid processes)."""
    return markexpr.strip() == "unit" or os.environ.get(NO_PROCESSES_ENV) == "1"
