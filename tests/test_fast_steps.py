"""The fast paths compute the same function as the reference implementation."""

import pytest
import torch

from mlbench.optim.centralized import sgd_update_
from mlbench.tasks.data.augment import crop_flip, draw_augmentation
from mlbench.tasks.losses import logistic_gradients_
from mlbench.tasks.models import build_model
from mlbench.worker.hyper import task_hyper


def test_closed_form_logistic_gradient_equals_autograd():
    torch.manual_seed(0)
    model = build_model("logreg", in_features=50).double()
    model.linear.bias = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))  # the step supports one too
    with torch.no_grad():
        model.linear.weight.normal_()
        model.linear.bias.fill_(0.3)
    x = torch.randn(100, 50, dtype=torch.float64)
    y = torch.randint(0, 2, (100,)).double() * 2 - 1
    l2 = 0.01
    reference = torch.nn.functional.softplus(-y * model(x)).mean() + 0.5 * l2 * (model.linear.weight ** 2).sum()
    reference.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with torch.no_grad():
        loss = logistic_gradients_(model, x, y, l2)
    assert abs(loss.item() - reference.item()) < 1e-12
    for got, want in zip((p.grad for p in model.parameters()), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # and in float32, the precision the benchmark runs at, to 1e-6
    model32 = model.float()
    for p in model32.parameters():
        p.grad = torch.zeros_like(p)
    with torch.no_grad():
        logistic_gradients_(model32, x.float(), y.float(), l2)
    for got, want in zip((p.grad for p in model32.parameters()), expected):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_foreach_sgd_update_equals_torch_sgd_over_several_steps():
    torch.manual_seed(0)
    for momentum, nesterov, wd in [(0.9, True, 1e-4), (0.9, False, 0.0), (0.0, False, 0.0)]:
        params = [torch.randn(7, 3), torch.randn(5)]
        ours = [p.clone() for p in params]
        bufs = [torch.zeros_like(p) for p in params]
        opt = torch.optim.SGD(params, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
        for step in range(5):
            grads = [torch.randn_like(p) for p in params]
            lr = 0.1 / (step + 1)
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.param_groups[0]["lr"] = lr
            opt.step()
            sgd_update_(ours, [g.clone() for g in grads], bufs, torch.tensor(lr), momentum=momentum,
                        nesterov=nesterov, weight_decay=wd)
            for a, b in zip(ours, params):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_batched_augmentation_has_torchvision_pipelines_distribution():
    """Mean and per-pixel variance over many draws of one image match RandomCrop(32, 4) + flip.
    (torchvision is imported here, not by the module: with it comes torch._dynamo, 2.5
    CPU-seconds that every test process collecting this module paid for this one test.)"""
    import torchvision.transforms.v2 as T

    torch.manual_seed(0)
    image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    draws = 8000
    dy, dx, flip = draw_augmentation(draws, seed=1, epoch=0)
    ours = crop_flip(image.expand(draws, -1, -1, -1), dy, dx, flip).float()
    reference_pipeline = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()])
    theirs = torch.stack([reference_pipeline(image[0]) for _ in range(draws)]).float()
    # standard error of a pixel mean over 8000 draws is < 255 / sqrt(8000) / 2 ~ 1.4
    assert (ours.mean(0) - theirs.mean(0)).abs().max() < 8
    assert (ours.mean() - theirs.mean()).abs() < 1
    assert ((ours == 0).float().mean() - (theirs == 0).float().mean()).abs() < 0.01  # padding share


def test_reference_step_equals_autograd_and_torch_sgd_in_float64():
    """The reference optimizer's step (eager) vs the textbook loop, 3 ResNet-20 steps, exact in
    float64.

    In float32 a fused and an unfused update differ by one rounding, which a ResNet at
    initialisation amplifies by ~30x per step; float64 shows the algorithms are equal.
    """
    from mlbench.optim.base import OptimizerContext
    from mlbench.optim.catalog import build_optimizer
    from mlbench.tasks.datasets import synthetic_splits
    from mlbench.tasks.pipeline import Pipeline
    from mlbench.tasks.task1a import TASK1A
    from mlbench.timing import PhaseTimer

    train, test = synthetic_splits("cifar10")
    cpu = torch.device("cpu")
    finals = []
    for fast in (True, False):
        torch.manual_seed(0)
        data = Pipeline(train, test, cpu, images=True)
        model = build_model("resnet20-v1").double()
        batches = [data.train_batch(torch.arange(i * 32, (i + 1) * 32)) for i in range(3)]
        batches = [(x.double(), y) for x, y in batches]
        if fast:
            ctx = OptimizerContext(model=model, hyper=task_hyper(TASK1A, 1), world_size=1, rank=0,
                                   timer=PhaseTimer(cpu))
            optimizer = build_optimizer("centralized-sgd", ctx)

            def gradients(i, model=model, batches=batches):
                x, y = batches[i]
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                return loss.detach()
            step = optimizer.make_step(gradients)
            for i in range(3):
                step(i, 0.05 * (i + 1))
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, nesterov=True, weight_decay=1e-4)
            for i, (x, y) in enumerate(batches):
                opt.param_groups[0]["lr"] = 0.05 * (i + 1)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
    for name in finals[0]:
        torch.testing.assert_close(finals[0][name], finals[1][name], rtol=0, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
@pytest.mark.parametrize("model_name", ["resnet20-v1", "logreg"])
def test_captured_cuda_graph_step_equals_eager_step_to_float32_rounding(model_name):
    from mlbench.results.events import EventWriter
    from mlbench.run_config import RunConfig
    from mlbench.tasks.overrides import resolve
    from mlbench.tasks.task1a import TASK1A
    from mlbench.tasks.task2a import TASK2A
    from mlbench.worker.trainer import Trainer

    class Discard:
        def write(self, event):
            pass

        def close(self):
            pass

    # Captured and eager steps may use different kernels (cuDNN picks its algorithm inside a
    # capture under other constraints), so they agree to float32 rounding, which training then
    # amplifies: on an H200, with TF32 off, their losses were 1e-7 apart at step 2 and 6e-5 at
    # step 8, ResNet-20's parameters 4e-6 apart after 2 steps, 3e-5 after 3, 8e-5 after 4. So
    # three steps (two replays of the graph on new batches and a new state), losses within
    # 1e-5 and parameters within 1e-4; the same three steps with a 1% larger learning rate move
    # the parameters by 3e-4, a stale batch buffer changes the second loss by 10%. TF32 off,
    # because its 10-bit products would make the rounding, not the step, the subject.
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    base = TASK2A if model_name == "logreg" else TASK1A
    spec, _ = resolve(base, {"batch_per_worker": 32})
    finals, losses = [], []
    for capture in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(RunConfig(task=spec, workers=1, data="synthetic", device="cuda", graph=capture),
                          0, EventWriter(Discard(), 0))
        trainer.setup()
        device = trainer.device
        trainer.runtime.begin_epoch(0)
        order = torch.randint(0, trainer.runtime.train_samples, (8, 32), generator=torch.Generator().manual_seed(1))
        losses.append([float(trainer.runtime.train_step(order[i].to(device), 0.01 / (i + 1), trainer.optimizer))
                       for i in range(3)])
        torch.cuda.synchronize()
        finals.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for name in finals[0]:
        torch.testing.assert_close(finals[1][name].float(), finals[0][name].float(), rtol=0, atol=1e-4)
