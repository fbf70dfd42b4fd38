"""Workers started by a launcher of the user's own (`mlbench run --record-only`, then torchrun),
writing into the shared run folder or, from a machine that does not share it, to the results
service over HTTP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import launcher_class
from mlbench.results.events import read_run_events
from mlbench.results.store import RunStore
from mlbench.server.httpd import make_server
from mlbench.server.service import ResultsService
from tests.helpers import last_run, mlbench
from tests.slurm.conftest import RUN_ARGS
from tests.slurm.test_slurm_runs import result_sentence


def torchrun() -> list[str]:
    path = shutil.which("torchrun")
    return [path] if path else [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture
def results_service():
    """The results service over this test's run store, in a thread: URL, worker token."""
    service = ResultsService(RunStore().home, "worker-" + "a" * 32, "admin-" + "b" * 32)
    server = make_server(service, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", "worker-" + "a" * 32
    server.shutdown()
    server.server_close()


def test_torchrun_on_a_recorded_run_gives_the_local_launchers_result(libsvm_dir, local_reference,
                                                                    results_service, tmp_path):
    proc = mlbench("run", *RUN_ARGS, "--data-dir", str(libsvm_dir), "--record-only", check=True)
    run = last_run()
    assert run.state == "pending" and run.launcher == "external"
    assert f"torchrun --standalone --nproc-per-node 2 -m mlbench.worker {run.run_dir}" in proc.stdout
    # a machine that does not share the run folder: a copy of run.json, events over HTTP
    node_dir = tmp_path / "node" / run.id
    node_dir.mkdir(parents=True)
    shutil.copy(run.run_dir / "run.json", node_dir / "run.json")
    url, secret = results_service
    token = mlbench("run-token", run.id, check=True, env=dict(os.environ, MLBENCH_WORKER_TOKEN=secret)).stdout.strip()
    assert mlbench("run-token", run.id).returncode == 2  # without the secret: a usage error
    subprocess.run([*torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "mlbench.worker", str(node_dir)],
                   check=True, timeout=300, capture_output=True,
                   env=dict(os.environ, MLBENCH_RESULTS_URL=url, MLBENCH_RESULTS_TOKEN=token))
    assert not (node_dir / "events").exists()  # every event went to the service's run folder
    details = mlbench("status", run.id, check=True).stdout
    run = last_run()
    assert run.state == "finished"
    result_line = next(line.split(None, 1)[1] for line in details.splitlines() if line.startswith("result"))
    assert result_sentence(result_line) == result_sentence(local_reference.stdout)
    assert run.result["final_accuracy"] == local_reference.result["final_accuracy"]
    for rank in (0, 1):
        for name, value in torch.load(node_dir / "checkpoints" / f"rank-{rank}.pt").items():
            assert torch.equal(value, local_reference.parameters[rank][name]), (rank, name)


def test_a_launcher_that_starts_another_number_of_workers_is_one_line(libsvm_dir):
    run = launcher_class("external")(RunStore()).create(RunRequest(task="task2a", workers=2,
                                                                   data_dir=str(libsvm_dir)))
    env = dict(os.environ, RANK="0", WORLD_SIZE="3", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = subprocess.run([sys.executable, "-m", "mlbench.worker", str(run.run_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"Error: torchrun started 3 worker(s) but the run in {run.run_dir} was "
                                   "recorded for 2; start 2 (e.g. --nproc-per-node / srun -n 2) or record "
                                   "a run for 3")
    # the refusal is the run's one event (no training was recorded), so `status` marks it failed
    # with the reason instead of leaving it pending (issue 21, item 11)
    recorded = read_run_events(run.run_dir)
    assert [e["name"] for e in recorded] == ["error"] and "recorded for 2" in recorded[0]["value"], recorded
