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

import numpy as np
import pytest

from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task2a import TASK2A
from tests.frameworks.in_process import (
    ATOL,
    RTOL,
    check_port_system,
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
