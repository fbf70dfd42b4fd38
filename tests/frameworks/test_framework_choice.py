"""A framework that is not installed, or a task it has no port of: one line naming the pip
extra (exit 1, as every missing extra) or what it runs (exit 2, a usage error), and nothing
recorded: no run folder, no catalog row."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import mlbench, run_ids, skip_unless_installed
from tests.test_extras import run_without


def nothing_recorded() -> bool:
    home = Path(os.environ["MLBENCH_HOME"])
    runs = home / "runs"
    return (not runs.exists() or not any(runs.iterdir())) and (not (home / "runs.db").exists() or run_ids() == [])


def test_a_task_without_a_jax_port_is_one_line_and_records_nothing():
    proc = mlbench("run", "task3a", "2", "--framework", "jax", "--data", "synthetic")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("Error: --framework jax: task3a has no JAX port (JAX runs task1a, task2a); "
                           "use --framework pytorch\n")
    assert nothing_recorded()


def test_jax_not_installed_names_the_extra_and_records_nothing():
    proc = run_without("jax,jaxlib,optax", "run", "task2a", "2", "--framework", "jax", "--data", "synthetic")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == "Error: --framework jax: JAX is not installed: pip install 'mlbench-suite[jax]'\n"
    assert nothing_recorded()


def test_tensorflow_not_installed_names_the_extra_and_records_nothing():
    proc = run_without("tensorflow", "run", "task2a", "2", "--framework", "tensorflow", "--data", "synthetic")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("Error: --framework tensorflow: TensorFlow is not installed: "
                           "pip install 'mlbench-suite[tensorflow]'\n")
    assert nothing_recorded()


def test_a_task_without_a_tensorflow_port_is_one_line_and_records_nothing():
    proc = mlbench("run", "task4b", "2", "--framework", "tensorflow", "--data", "synthetic")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("Error: --framework tensorflow: task4b has no TensorFlow port (TensorFlow runs "
                           "task1a, task2a); use --framework pytorch\n")
    assert nothing_recorded()


@pytest.mark.parametrize("args, message", [
    (["--optimizer", "powersgd"], "--framework jax trains with the task's reference optimizer only; "
                                   "drop --optimizer/--opt"),
    (["--time-budget", "1m"], "--framework jax: --time-budget is not in this port yet (it runs on CPUs, over gloo)"),
    # accepted before, and the port wrote no checkpoint: `status` said "none written yet", resume refused
    (["--checkpoint-every", "20steps"],
     "--framework jax: --checkpoint-every is not in this port yet (it runs on CPUs, over gloo)"),
])
def test_what_the_jax_port_does_not_offer_is_refused_before_anything_is_recorded(args, message):
    skip_unless_installed("jax")
    proc = mlbench("run", "task2a", "2", "--framework", "jax", "--data", "synthetic", *args)
    assert (proc.returncode, proc.stderr) == (2, f"Error: {message}\n")
    assert nothing_recorded()


def test_runs_of_different_frameworks_never_share_a_row_of_compare():
    from mlbench.results.compare import compare_runs
    from mlbench.results.report import family_heading, framework_of, run_overview
    from mlbench.results.store import RunStore
    from tests.results.recorded import record_run

    store = RunStore()
    old = record_run(store, workers=2, task="task2a", tta=10.0)   # recorded before --framework
    jax_run = record_run(store, workers=2, task="task2a", tta=20.0, framework="jax")
    comparison = compare_runs([old, jax_run])
    assert sorted((g.family.framework, len(g.runs)) for g in comparison.groups) == [("jax", 1), ("pytorch", 1)]
    assert [family_heading(f).split(" | ")[:2] for f in comparison.families()] == [["task2a", "jax"],
                                                                                 ["task2a", "closed division"]]
    assert (framework_of(old), run_overview(jax_run)["framework"]) == ("pytorch", "jax")


def test_a_port_worker_in_a_python_without_its_framework_records_one_line_naming_the_image_to_build(tmp_path):
    """What a cluster's pod says when its image lacks the port (the CLI checks its own Python
    only where the workers run it): the worker of a JAX run's folder, started where JAX cannot
    be imported, records the line as the run's error and exits 1, without a traceback."""
    import subprocess
    import sys

    from mlbench.launch.plan import RunRequest, WorkerResources, build_config
    from mlbench.results.events import read_run_events
    from mlbench.run_config import RunDocument

    # planned as for a pod: the image's framework is not this Python's to check
    config, _ = build_config(RunRequest(task="task2a", workers=1, data="synthetic", framework="jax"),
                             WorkerResources(threads=1))
    RunDocument(task="task2a", config=config, id="abc").save(tmp_path)
    hide = ("import runpy, sys\nfor name in ('jax', 'jaxlib', 'optax'):\n    sys.modules[name] = None\n"
            # the CLI plans a cluster's run without JAX here (a local one is refused: above)
            "from mlbench.launch.plan import RunRequest, WorkerResources, build_config\n"
            "build_config(RunRequest(task='task2a', workers=2, data='synthetic', framework='jax'), "
            "WorkerResources(threads=1))\n")
    proc = subprocess.run([sys.executable, "-c", hide + "runpy.run_module('mlbench.worker.jax_worker', "
                           "run_name='__main__')", str(tmp_path), "--rank", "0"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    line = ("this worker's Python has no JAX (pip install 'mlbench-suite[jax]'); on a cluster, run the image "
            "`mlbench image build --framework jax` builds, or pass --image with one that has it")
    assert (proc.returncode, proc.stderr) == (1, f"Error: {line}\n")
    assert [e["value"] for e in read_run_events(tmp_path) if e["name"] == "error"] == [line]
