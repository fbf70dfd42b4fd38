"""k workers with batch b give the parameters of one process with batch k*b (to 1e-5, relative).

The distributed side is the real thing: `mlbench run` with 2 worker processes over gloo. The
reference is plain PyTorch in this process, written from the algorithm's definition: one global
minibatch of k*b samples (the same samples, the same augmentation), the gradient of the mean
loss, the task's SGD update with the learning rate of k workers. For ResNet the reference
computes BatchNorm statistics per worker-sized chunk of the global batch, because each worker
normalises its own minibatch: that, and only that, is what synchronous SGD with local BatchNorm
computes.
"""

import pytest
import torch

from mlbench.results.environment import usable_cores
from mlbench.tasks.classification import learning_rate
from mlbench.tasks.data.sharding import epoch_batches, steps_per_epoch
from mlbench.tasks.datasets import load_splits
from mlbench.tasks.losses import get_loss, regulariser
from mlbench.tasks.models import build_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A
from tests.helpers import checkpoint, last_run, mlbench

K = 2
STEPS = 5


def reference_parameters(spec, data_dir, batch_per_worker, steps, ghost_batches):
    # Same intra-op thread count as each worker: a ResNet at initialisation amplifies float
    # rounding differences (another summation order) by ~30x per step.
    torch.set_num_threads(max(1, usable_cores() // K))
    train, test = load_splits(spec.dataset, "real", str(data_dir))
    images = spec.dataset == "cifar10"
    pipe = Pipeline(train, test, torch.device("cpu"), images=images)
    torch.manual_seed(0)
    model = build_model(spec.model, in_features=None if images else pipe.num_features)
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=spec.momentum, nesterov=spec.nesterov,
                          weight_decay=spec.weight_decay)
    spe = steps_per_epoch(pipe.num_train, K, batch_per_worker)
    batches = epoch_batches(pipe.num_train, workers=1, rank=0, batch_per_worker=K * batch_per_worker,
                            seed=0, epoch=0)
    pipe.begin_epoch(0, 0)
    for step in range(steps):
        x, y = pipe.train_batch(batches[step])
        opt.zero_grad()
        chunks = zip(x.chunk(ghost_batches), y.chunk(ghost_batches))
        loss = sum(get_loss(spec.loss).value(model(cx), cy, "mean") for cx, cy in chunks) / ghost_batches
        (loss + regulariser(model, spec.l2)).backward()
        for group in opt.param_groups:
            group["lr"] = learning_rate(spec.lr, workers=K, batch_per_worker=batch_per_worker,
                                        step=step, steps_per_epoch=spe)
        opt.step()
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def assert_equal_to_reference(reference, run):
    for rank in range(K):
        state = checkpoint(run, rank)
        for name, expected in reference.items():
            torch.testing.assert_close(state[name], expected, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {name}")


def test_task2a_two_workers_equal_one_process_with_double_batch(libsvm_dir):
    mlbench("run", "task2a", str(K), "--data-dir", str(libsvm_dir), "--max-steps", str(STEPS),
            "--set", "batch_per_worker=50", "--save-model", "--log-every", "1", check=True)
    spec, _ = resolve(TASK2A, {"batch_per_worker": 50})
    reference = reference_parameters(spec, libsvm_dir, 50, STEPS, ghost_batches=1)
    assert reference["linear.weight"].abs().sum() > 0
    assert_equal_to_reference(reference, last_run())


def test_task1a_two_workers_equal_one_process_with_double_batch(cifar_dir):
    mlbench("run", "task1a", str(K), "--data-dir", str(cifar_dir), "--max-steps", str(STEPS),
            "--set", "batch_per_worker=16", "--save-model", "--log-every", "1", check=True)
    spec, _ = resolve(TASK1A, {"batch_per_worker": 16})
    reference = reference_parameters(spec, cifar_dir, 16, STEPS, ghost_batches=K)
    assert_equal_to_reference(reference, last_run())
