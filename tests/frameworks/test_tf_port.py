"""The TensorFlow 2 port of task 2a trains the same as the PyTorch worker, and as itself on one process.

From the same initial weights (zero) and the same data order (mlbench's ``epoch_batches``), the
first 50 training losses of the TensorFlow port equal PyTorch's within ``rtol=1e-5, atol=1e-6``,
the tolerance of the JAX port and for the same reason: each loss is a float32 mean of 100
softplus terms, whose worst-case rounding is n*u = 100 * 2**-24 = 6e-6 relative; TensorFlow's
softplus, its reduction order and its tape's gradient differ from PyTorch's by a few ulp per
step, which the 50 updates carry into the weights. The test-set metrics come from the same NumPy
scorer and agree to the same order.

Then a real `mlbench run task2a 2 --framework tensorflow` (two processes,
MultiWorkerMirroredStrategy over gRPC on 127.0.0.1): its two ranks' losses average to those of one
TensorFlow process with the doubled batch (the same samples, the rate of 2 workers), to the same
tolerance.
"""

import contextlib
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task2a import TASK2A
from tests.frameworks.in_process import (
    ATOL,
    RTOL,
    check_measured_bytes,
    check_phases_said,
    check_port_system,
    check_saved_weights,
    one_tensorflow_thread,
    train_pytorch_in_process,
    train_tf_in_process,
    values,
)
from tests.helpers import events, mlbench, requires, run_json
from tests.shared_runs import PORT_RUN_STEPS, port_run

pytestmark = requires("tensorflow")


@pytest.fixture(scope="module", autouse=True)
def _tensorflow_on_one_thread() -> None:
    import tensorflow as tf

    one_tensorflow_thread(tf)


def test_the_first_50_losses_of_the_tensorflow_port_equal_pytorchs(libsvm_dir):
    spec, _ = resolve(TASK2A, {})
    config = RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=50, log_every=1,
                       stop_at_goal=False)
    torch_events = train_pytorch_in_process(config)
    tf_events = train_tf_in_process(config)
    torch_losses, tf_losses = values(torch_events, "train/loss"), values(tf_events, "train/loss")
    assert len(torch_losses) == len(tf_losses) == 50
    np.testing.assert_allclose(tf_losses, torch_losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(values(tf_events, "eval/loss"), values(torch_events, "eval/loss"),
                               rtol=RTOL, atol=ATOL)
    # 500 test samples: one sample's verdict would move the accuracy by 0.002
    assert values(tf_events, "eval/accuracy").tolist() == values(torch_events, "eval/accuracy").tolist()
    check_port_system(tf_events, torch_events, steps=50)


@pytest.mark.slow
def test_two_tensorflow_workers_equal_one_tensorflow_process_with_the_doubled_batch(libsvm_dir, shared_runs):
    shared = port_run(shared_runs, "tensorflow", libsvm_dir)   # tests/slurm compares its Slurm run with it
    steps, run = PORT_RUN_STEPS, shared.record
    assert run_json(run)["config"]["framework"] == "tensorflow"
    recorded = events(run)
    two = (values(recorded, "train/loss", 0) + values(recorded, "train/loss", 1)) / 2
    assert len(two) == steps, shared.stdout
    environment = next(e["value"] for e in recorded if e["name"] == "environment")
    assert environment["framework"] == "tensorflow" and environment["tensorflow"]
    # TensorFlow's native import lines (absl before its set-up, oneDNN's notice) stay off the terminal
    assert shared.stderr == "", shared.stderr
    # its collectives go over gRPC, whatever the run's --backend: the header says what they use
    assert "2 worker(s) x 1 thread(s), cpu/grpc, " in shared.stdout.splitlines()[0], shared.stdout

    spec, _ = resolve(TASK2A, {"batch_per_worker": 200, "lr.alpha": 400})
    one = train_tf_in_process(RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=steps,
                                        log_every=1, stop_at_goal=False))
    np.testing.assert_allclose(two, values(one, "train/loss"), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(values(recorded, "eval/loss"), values(one, "eval/loss"), rtol=RTOL, atol=ATOL)
    check_measured_bytes(recorded, run)
    check_phases_said(run, "TensorFlow")


def _listening_inodes(table_dir: Path) -> dict[int, str]:
    """The sockets listening in one network namespace's TCP tables (``/proc/.../net``): inode to
    local address, as the kernel prints it (hex)."""
    found = {}
    for table in ("tcp", "tcp6"):
        for line in (table_dir / table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":   # LISTEN
                found[int(fields[9])] = fields[1]
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


@pytest.mark.slow
def test_a_local_tensorflow_runs_grpc_servers_cannot_be_reached_from_outside_its_workers(libsvm_dir):
    """TensorFlow's gRPC servers bind ``0.0.0.0`` whatever address they are given, and a server
    anyone can reach can be made to run code. The workers of a local run therefore train in one
    network namespace whose only interface is its loopback: while they train, each holds a
    listening socket there, none of them is in this machine's tables (``ss -ltn`` shows no
    listener of theirs), and connecting to their addresses from here is refused."""
    from tests.helpers import last_run, wait_for

    start = mlbench("run", "task2a", "2", "--framework", "tensorflow", "--data-dir", str(libsvm_dir),
                    "--max-steps", "1000000", "--no-stop", "--detach")
    assert start.returncode == 0, start.stdout + start.stderr
    run = last_run()
    try:
        wait_for(lambda: all((run.run_dir / "events" / f"rank-{r}.jsonl").exists() and
                             "train/loss" in (run.run_dir / "events" / f"rank-{r}.jsonl").read_text()
                             for r in (0, 1)), 240, "both TensorFlow workers to train", 0.5)
        workers = json.loads((run.run_dir / "pids.json").read_text())["workers"]
        host_listeners = _listening_inodes(Path("/proc/net"))
        ports = set()
        for pid in workers:
            own = _socket_inodes(pid)
            inside = _listening_inodes(Path(f"/proc/{pid}/net"))
            assert own & set(inside), f"worker {pid} holds no listening socket: not its gRPC server?"
            assert not own & set(host_listeners), {i: host_listeners[i] for i in own & set(host_listeners)}
            ports |= {int(inside[inode].rsplit(":", 1)[1], 16) for inode in own & set(inside)}
            interfaces = [line.split(":")[0].strip() for line in
                          Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
            assert interfaces == ["lo"], interfaces
        for port in ports:
            with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
                probe.connect(("127.0.0.1", port))
    finally:
        mlbench("cancel", run.id)


def test_the_saved_weights_load_into_the_pytorch_model_and_give_the_ports_logits(libsvm_dir, tmp_path):
    from mlbench.worker.tf_worker import TfTrainer, join

    check_saved_weights(TfTrainer, join, libsvm_dir, tmp_path)
