"""The JAX port of task 2a trains the same as the PyTorch worker, and as itself on one process.

From the same initial weights (zero) and the same data order (mlbench's ``epoch_batches``), the
first 50 training losses of the JAX port equal PyTorch's within ``rtol=1e-5, atol=1e-6``: each loss
is a float32 mean of 100 softplus terms, whose worst-case rounding is n*u = 100 * 2**-24 = 6e-6
relative; the two frameworks also differ in their softplus and in how the gradient is formed
(PyTorch's closed form, JAX's autodiff), a few ulp per step that the 50 updates carry into the
weights (measured: 1.3e-6 at most, on losses down to 0.05, absolute). The test-set metrics come
from the same NumPy scorer and agree to the same order.

Then a real `mlbench run task2a 2 --framework jax` (two processes, jax.distributed, gloo): its
two ranks' losses average to those of one JAX process with the doubled batch (the same samples,
the rate of 2 workers), to the same tolerance.
"""

import ipaddress
import os
import signal
import socket
import subprocess
import sys
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
    train_jax_in_process,
    train_pytorch_in_process,
    values,
)
from tests.helpers import events, requires, run_json
from tests.shared_runs import PORT_RUN_STEPS, port_run

pytestmark = requires("jax", "optax")


def train_both_in_process(config):
    """The events of the PyTorch worker's loop and of the JAX worker's, each on one process."""
    return train_pytorch_in_process(config), train_jax_in_process(config)


def test_the_first_50_losses_of_the_jax_port_equal_pytorchs(libsvm_dir):
    spec, _ = resolve(TASK2A, {})
    config = RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=50, log_every=1,
                       stop_at_goal=False)
    torch_events, jax_events = train_both_in_process(config)
    torch_losses, jax_losses = values(torch_events, "train/loss"), values(jax_events, "train/loss")
    assert len(torch_losses) == len(jax_losses) == 50
    np.testing.assert_allclose(jax_losses, torch_losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(values(jax_events, "eval/loss"), values(torch_events, "eval/loss"),
                               rtol=RTOL, atol=ATOL)
    # 500 test samples: one sample's verdict would move the accuracy by 0.002
    assert values(jax_events, "eval/accuracy").tolist() == values(torch_events, "eval/accuracy").tolist()
    check_port_system(jax_events, torch_events, steps=50)


@pytest.mark.slow
def test_two_jax_workers_equal_one_jax_process_with_the_doubled_batch(libsvm_dir, shared_runs):
    shared = port_run(shared_runs, "jax", libsvm_dir)   # tests/slurm compares its Slurm run with it
    steps, run = PORT_RUN_STEPS, shared.record
    assert run_json(run)["config"]["framework"] == "jax"
    recorded = events(run)
    two = (values(recorded, "train/loss", 0) + values(recorded, "train/loss", 1)) / 2
    assert len(two) == steps, shared.stdout

    spec, _ = resolve(TASK2A, {"batch_per_worker": 200, "lr.alpha": 400})
    one = train_jax_in_process(RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=steps,
                                         log_every=1, stop_at_goal=False))
    np.testing.assert_allclose(two, values(one, "train/loss"), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(values(recorded, "eval/loss"), values(one, "eval/loss"), rtol=RTOL, atol=ATOL)
    check_measured_bytes(recorded, run)
    check_phases_said(run, "JAX")


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP ``port`` (/proc/net/tcp and tcp6)."""
    found = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for line in table.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:   # 0A: LISTEN
                raw = bytes.fromhex(address)
                # the kernel prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(words)
                found.add(str(getattr(ip, "ipv4_mapped", None) or ip))   # ::ffff:127.0.0.1 is 127.0.0.1
    return found


def test_a_local_runs_coordinator_listens_on_the_loopback_address_only():
    """Rank 0 of a local two-worker run hosts JAX's coordinator at 127.0.0.1 and listens there
    only, as PyTorch's store (left to itself, JAX listens on every interface, ``[::]``); started
    alone, it waits for rank 1 meanwhile. A pod's or a namespace's own address
    (``MLBENCH_BIND_ADDR``) is where it listens there; a host name (Slurm) keeps JAX's default."""
    from mlbench.worker.jax_worker import coordinator_bind_address
    from tests.helpers import wait_for

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = ("from mlbench.launch.plan import RunRequest, build_config\n"
            "from mlbench.worker.jax_worker import _join\n"
            "config, _ = build_config(RunRequest(task='task2a', workers=2, data='synthetic'))\n"
            f"_join(config, 0, '127.0.0.1:{port}')\n")
    env = {k: v for k, v in os.environ.items() if k != "MLBENCH_BIND_ADDR"}
    rank0 = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: listening_addresses(port) or rank0.poll() is not None, 120, "the coordinator to listen",
                 0.2)
        assert rank0.poll() is None, rank0.stderr.read().decode()[-2000:]
        assert listening_addresses(port) == {"127.0.0.1"}
    finally:
        os.killpg(rank0.pid, signal.SIGKILL)
        rank0.wait()

    assert coordinator_bind_address("127.0.0.1:4000") == "127.0.0.1:4000"
    assert coordinator_bind_address("node-3:4000") is None
    os.environ["MLBENCH_BIND_ADDR"] = "10.1.2.3"
    try:
        assert coordinator_bind_address("mlbench-r-0.mlbench-r:4000") == "10.1.2.3:4000"
        os.environ["MLBENCH_BIND_ADDR"] = "fd00::5"
        assert coordinator_bind_address("mlbench-r-0.mlbench-r:4000") == "[fd00::5]:4000"
    finally:
        del os.environ["MLBENCH_BIND_ADDR"]


def test_the_saved_weights_load_into_the_pytorch_model_and_give_the_ports_logits(libsvm_dir, tmp_path):
    from mlbench.worker.jax_worker import JaxTrainer, _join

    check_saved_weights(JaxTrainer, _join, libsvm_dir, tmp_path)


def test_a_two_worker_jax_run_saves_each_ranks_weights_in_its_run_folder():
    """`--save-model` through the worker's entry: each rank's file, the same weights on both (the
    ranks hold one model), which mlbench's PyTorch model takes."""
    import torch

    from mlbench.tasks.models import build_model
    from tests.helpers import last_run, mlbench

    mlbench("run", "task2a", "2", "--framework", "jax", "--data", "synthetic", "--max-steps", "3", "--save-model",
            check=True)
    folder = Path(last_run().run_dir) / "checkpoints"
    saved = [torch.load(folder / f"rank-{rank}.pt") for rank in (0, 1)]
    assert list(saved[0]) == ["linear.weight"] and torch.equal(saved[0]["linear.weight"], saved[1]["linear.weight"])
    model = build_model("logreg", in_features=saved[0]["linear.weight"].shape[1])
    model.load_state_dict(saved[0], strict=True)
    assert model.linear.weight.abs().max() > 0
