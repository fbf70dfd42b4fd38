"""What the ResNet ports' tests share (tests/frameworks/test_jax_resnet.py, test_tf_resnet.py):
PyTorch's task 1a trained in one process as K workers would train it, the two references both
ports are checked against (computed once per session: tests/frameworks/conftest.py), and the
per-step bounds within which a float32 port's losses follow it (their reasons: test_jax_resnet.py's
docstring)."""

import functools

import numpy as np
import torch

from mlbench.run_config import RunConfig
from mlbench.tasks.classification import learning_rate
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.data.sharding import epoch_batches, steps_per_epoch
from mlbench.tasks.datasets import load_splits
from mlbench.tasks.models import build_model
from mlbench.tasks.pipeline import Pipeline

FORWARD_RTOL = 1e-6     # the first loss: one float32 forward pass in each framework
ONE_UPDATE_RTOL = 1e-4  # the second: after one update from float32 gradients
CHAOS_RTOL = 0.2        # the rest: float32 trajectories of a ResNet at initialisation part (docstring)

#: the float32 check: the first 50 steps of the workers' loops at a batch of 16 (the task's 32 costs
#: twice the CPU); the float64 check: 3 steps at a batch of 8 show the arithmetic as 10 would
#: (rounding is 1e-16 there, a wrong convention 1e-4 or more from the first update on)
FLOAT32_BATCH, FLOAT32_STEPS = 16, 50
FLOAT64_BATCH, FLOAT64_STEPS = 8, 3


def float32_config(cifar_dir) -> RunConfig:
    """The run both ports' worker loops and the PyTorch worker's train in the float32 check."""
    spec, _ = resolve(TASK1A, {"batch_per_worker": FLOAT32_BATCH})
    return RunConfig(task=spec, workers=1, data_dir=str(cifar_dir), max_steps=FLOAT32_STEPS, log_every=1,
                     stop_at_goal=False)


def pytorch_reference(spec, data_dir, steps, *, dtype=torch.float32, workers=1):
    """PyTorch's ResNet trained on the first ``steps`` global batches of ``workers`` workers in
    one process: each worker's share of a batch a chunk of its own (its own BatchNorm
    statistics), the gradient of the chunks' mean loss, torch.optim.SGD; the losses of every
    step and chunk [steps, workers], the model and the initial state dict (float32)."""
    settings = spec.settings
    batch = settings.batch_per_worker
    train, test = load_splits(settings.dataset, "real", str(data_dir))
    pipe = Pipeline(train, test, torch.device("cpu"), images=True)
    torch.manual_seed(0)
    model = build_model(settings.model)
    initial = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=settings.momentum, nesterov=settings.nesterov,
                          weight_decay=settings.weight_decay)
    spe = steps_per_epoch(pipe.num_train, workers, batch)
    order = epoch_batches(pipe.num_train, workers=1, rank=0, batch_per_worker=workers * batch, seed=0, epoch=0)
    pipe.begin_epoch(0, 0)
    losses, batches = [], []
    for step in range(steps):
        x, y = pipe.train_batch(order[step])
        batches.append((x.numpy(), y.numpy()))
        opt.zero_grad()
        chunk_losses = [torch.nn.functional.cross_entropy(model(cx.to(dtype)), cy)
                        for cx, cy in zip(x.chunk(workers), y.chunk(workers))]
        (sum(chunk_losses) / workers).backward()
        for group in opt.param_groups:
            group["lr"] = learning_rate(settings.lr, workers=workers, batch_per_worker=batch, step=step,
                                        steps_per_epoch=spe)
        opt.step()
        losses.append([v.detach().item() for v in chunk_losses])
    return np.array(losses), model, initial, batches, spe


def check_losses(port_losses, torch_losses):
    np.testing.assert_allclose(port_losses[0], torch_losses[0], rtol=FORWARD_RTOL)
    np.testing.assert_allclose(port_losses[1], torch_losses[1], rtol=ONE_UPDATE_RTOL)
    np.testing.assert_allclose(port_losses[2:], torch_losses[2:], rtol=CHAOS_RTOL)


def check_port_against_pytorch_events(port_events, torch_events) -> None:
    """What a port's worker loop records beside its losses equals the PyTorch worker's: the
    learning rates exactly, the test loss within float32's trajectories, the FLOPs of a step."""
    from mlbench.tasks.flops import FLOP_COUNTER
    from tests.frameworks.in_process import newest_system, values

    assert values(port_events, "train/lr").tolist() == values(torch_events, "train/lr").tolist()
    np.testing.assert_allclose(values(port_events, "eval/loss"), values(torch_events, "eval/loss"),
                               rtol=CHAOS_RTOL)
    port, reference = newest_system(port_events), newest_system(torch_events)
    assert port["flops_per_step"] == reference["flops_per_step"] > 0
    assert port["flops_method"] == reference["flops_method"] == FLOP_COUNTER


def check_a_real_two_worker_run(framework: str, cifar_dir) -> None:
    """A real ``mlbench run task1a 2 --framework FRAMEWORK`` of two steps: its result shows on
    ``status RUN`` with the framework, and each rank's loss equals that of its own half of the
    global batch in one PyTorch process (:func:`pytorch_reference` with 2 workers), at the first
    step (the forward pass) and after the update from the two workers' averaged gradients."""
    from tests.frameworks.in_process import values
    from tests.helpers import events, last_run, mlbench, run_json

    steps, batch = 2, 16
    mlbench("run", "task1a", "2", "--framework", framework, "--data-dir", str(cifar_dir), "--max-steps",
            str(steps), "--log-every", "1", "--no-stop", "--set", f"batch_per_worker={batch}", check=True)
    run = last_run()
    assert run_json(run)["config"]["framework"] == framework
    shown = mlbench("status", run.id, check=True).stdout.splitlines()
    assert ["framework", framework] in [line.split() for line in shown]
    recorded = events(run)
    (result,) = [e["value"] for e in recorded if e["name"] == "result"]
    assert (result["steps"], result["stop_reason"]) == (steps, "max-steps")
    assert result["final_accuracy"] is not None
    ranks = np.stack([values(recorded, "train/loss", rank) for rank in (0, 1)], axis=1)
    check_losses(ranks, two_worker_losses(str(cifar_dir), steps, batch))


@functools.cache
def two_worker_losses(cifar_dir: str, steps: int, batch: int) -> np.ndarray:
    """:func:`pytorch_reference`'s losses [steps, 2] for 2 workers of ``batch``: the same for the
    JAX and the TensorFlow run, computed once."""
    spec, _ = resolve(TASK1A, {"batch_per_worker": batch})
    losses, *_ = pytorch_reference(spec, cifar_dir, steps, workers=2)
    losses.setflags(write=False)
    return losses
