"""The one door to the launchers (launch/registry.py): every launcher is found by the name its
runs record, chosen by the options it declares, and records the machines a run occupies."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from mlbench.errors import UsageError
from mlbench.launch.base import LaunchSettings
from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import LAUNCHERS, choose, launcher_class, launcher_classes, launcher_of
from mlbench.launch.supervisor import record_supervisor
from tests.helpers import skip_unless_installed
from mlbench.results.store import RunStore, read_json
from mlbench.run_config import Occupancy, occupancy


def test_every_launcher_is_registered_by_the_name_its_runs_record_and_options_do_not_clash():
    assert [cls.name for cls in launcher_classes()] == list(LAUNCHERS)
    declared = [o for cls in launcher_classes() for o in ([cls.choose_option] if cls.choose_option else [])
                + list(cls.options)]
    assert len({o.flag for o in declared}) == len(declared) and len({o.name for o in declared}) == len(declared)
    with pytest.raises(UsageError, match="unknown launcher 'ssh'; mlbench has local, slurm, external, kubernetes"):
        launcher_class("ssh")


@pytest.mark.parametrize("values, chosen", [({}, "local"), ({"slurm": True}, "slurm"),
                                            ({"record_only": True}, "external")])
def test_the_options_choose_the_launcher_of_new_runs(values, chosen):
    assert choose(RunStore(), values).name == chosen


@pytest.mark.parametrize("values, message", [
    ({"image": "mine:1"}, "--image is an option of cluster runs; choose a cluster with `mlbench set-cluster` first"),
    ({"partition": "gpu", "record_only": True}, "--partition is an option of Slurm runs; add --slurm"),
    ({"slurm": True, "record_only": True},
     "--slurm and --record-only choose different launchers (slurm, external): choose one"),
    ({"slurm": True, "time": "1 h"}, "--time '1 h': give one word without spaces"),
    ({"slurm": True, "cpus_per_task": 0}, "--cpus-per-task must be at least 1, not 0"),
    ({"slurm": True, "cpus_per_task": -2}, "--cpus-per-task must be at least 1, not -2"),
])
def test_contradicting_or_foreign_options_are_one_usage_error(values, message):
    with pytest.raises(UsageError) as refused:
        choose(RunStore(), values)
    assert str(refused.value) == message


def test_a_run_records_the_nodes_it_occupies_as_its_launcher_counts_them():
    store = RunStore()
    local = choose(store, {}).create(RunRequest(task="task2a", workers=3, data="synthetic"))
    assert (read_json(local.run_dir / "run.json")["nodes"], read_json(local.run_dir / "run.json")["on_this_machine"]) \
        == (1, True)
    slurm = launcher_class("slurm")
    request = RunRequest(task="task2a", workers=8, data="synthetic")
    for extra, nodes in (([], 8), (["--nodes=2"], 2), (["-N 3"], 3), (["--nodes=1-4"], 4), (["--nodes=16"], 8)):
        assert slurm(store, LaunchSettings({"sbatch_options": extra})).occupied_nodes(request, None) == nodes, extra


def test_a_run_json_from_before_nodes_were_recorded_falls_back_to_the_rule_of_its_time():
    store = RunStore()
    old_local = store.create(task="task2a", workers=4, division="open", launcher="local", run_json={})
    old_cluster = store.create(task="task2a", workers=4, division="open", launcher="kubernetes", run_json={})
    assert occupancy(old_local.run_dir, "local", 4) == Occupancy(1, True)
    assert occupancy(old_cluster.run_dir, "kubernetes", 4) == Occupancy(4, False)


def test_an_old_mpi_run_recorded_as_local_is_reconciled_by_the_local_launcher():
    """Runs with --backend mpi record launcher "local": their supervisor is a local one."""
    store = RunStore()
    run = store.create(task="task2a", workers=2, division="open", launcher="local",
                       run_json={"task": "task2a", "config": {"backend": "mpi"}})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record_supervisor(run.run_dir, gone.pid)
    store.mark_running(run.id, gone.pid)
    launcher = launcher_of(store, store.get(run.id))
    assert launcher.name == "local"
    after = launcher.reconcile(store.get(run.id))
    assert after.state == "failed" and f"supervising process (pid {gone.pid}) ended unexpectedly" in after.reason


def test_a_run_of_an_unregistered_launcher_is_read_by_the_launcher_of_its_store():
    store = RunStore()
    run = store.create(task="task2a", workers=1, division="open", launcher="retired", run_json={})
    assert launcher_of(store, run).name == "local"


def test_slurm_cpus_per_task_0_is_a_usage_error_of_the_cli_and_records_nothing():
    from click.testing import CliRunner

    import mlbench.cli.commands  # noqa: F401  (registers the commands)
    from mlbench.cli import cli

    result = CliRunner().invoke(cli, ["run", "task0a", "2", "--slurm", "--cpus-per-task", "0"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == ["Error: --cpus-per-task must be at least 1, not 0"]
    assert RunStore().list() == []


@pytest.mark.parametrize("launcher, asked, message", [
    ("external", {"framework": "jax"}, "--framework jax: --record-only runs start PyTorch workers only so far; "
                                       "run on this machine"),
    ("external", {"inject": "stall:rank=1,at=5s"},
     "--inject stall:rank=1,at=5s: --record-only runs cannot inject a stall (they apply none); run on this machine"),
    ("external", {"on_failure": "restart"},
     "--on-failure restart: --record-only runs carry out fail only; run on this machine"),
])
def test_each_launcher_refuses_what_its_abilities_leave_out_before_anything_is_recorded(launcher, asked, message):
    from mlbench.launch.faults import parse_inject

    if "framework" in asked:
        pytest.importorskip("jax" if asked["framework"] == "jax" else "tensorflow")
    store = RunStore()
    fields = {k: v for k, v in asked.items() if k != "inject"}
    request = RunRequest(task="task2a", workers=2, data="synthetic", max_restarts=0, **fields,
                         faults=[parse_inject(asked["inject"])] if "inject" in asked else [])
    with pytest.raises(UsageError) as refused:
        launcher_class(launcher)(store).create(request)
    assert str(refused.value) == message
    assert store.list() == []
    # the local launcher does all of it (a record-only run is enough to see it accepted)
    assert choose(store, {}).record(request).state == "pending"


def test_a_launcher_that_cannot_give_each_worker_an_address_refuses_tensorflow_on_several():
    """Every built-in launcher that starts TensorFlow workers gives each its address (local: free
    ports; Slurm: from the step's variables; Kubernetes: its pod's name under the run's Service); a launcher
    that declares it cannot is refused."""
    from mlbench.launch.plan import LauncherAbilities, build_config

    skip_unless_installed("tensorflow")
    abilities = LauncherAbilities(frameworks=("pytorch", "tensorflow"))
    config, _ = build_config(RunRequest(task="task2a", workers=2, data="synthetic", framework="tensorflow"))
    with pytest.raises(UsageError) as refused:
        abilities.check(config, "Plug-in")
    assert str(refused.value) == (
        "--framework tensorflow on 2 workers: every TensorFlow worker listens on an address of its own, which "
        "Plug-in runs cannot yet give each worker before it starts; run one worker, another framework, or on "
        "this machine")
    one, _ = build_config(RunRequest(task="task2a", workers=1, data="synthetic", framework="tensorflow"))
    abilities.check(one, "Plug-in")


def test_a_cluster_run_takes_the_faults_its_supervisor_applies_and_refuses_the_rest_in_one_line(tmp_path):
    """On Kubernetes the supervisor beside the store deletes a killed rank's pod and records a
    straggler's windows and restarts the group or goes on with its survivors (docs/faults.md, On a
    cluster); a stall and a --checkpoint-dir of this machine (its pods keep them on the service's
    volume) are refused before anything is recorded."""
    pytest.importorskip("kubernetes")
    from mlbench.launch.faults import parse_inject
    from mlbench.launch.kubernetes import KubernetesLauncher
    from mlbench.launch.plan import build_config

    def config(*faults: str, on_failure: str = "fail", **checkpoints: Any):
        request = RunRequest(task="task2a", workers=2, data="synthetic", on_failure=on_failure, max_restarts=0,
                             faults=[parse_inject(text) for text in faults], **checkpoints)
        return build_config(request)[0]

    abilities = KubernetesLauncher.abilities
    abilities.check(config("kill:rank=1,at=30s", "slow:rank=0,factor=3", on_failure="restart"), "cluster")
    abilities.check(config("kill:rank=1,at=30s", on_failure="shrink"), "cluster")
    for asked, message in [
        (config("stall:rank=1,at=5s"), "--inject stall:rank=1,at=5s: cluster runs cannot inject a stall (they "
                                        "apply kill, slow); run on this machine"),
        (config(checkpoint_every_steps=20, checkpoint_dir=str(tmp_path)),
         f"--checkpoint-dir {tmp_path}: cluster runs keep their checkpoints on the results service's volume; "
         "leave it out"),
    ]:
        with pytest.raises(UsageError) as refused:
            abilities.check(asked, "cluster")
        assert str(refused.value) == message
