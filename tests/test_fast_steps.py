"""The fast paths compute the same function as the reference implementation."""

import torch
import torchvision.transforms.v2 as T

from mlbench.tasks.data.augment import crop_flip, draw_augmentation
from mlbench.tasks.models import build_model
from mlbench.worker.steps import logistic_gradients_, sgd_update_


def test_closed_form_logistic_gradient_equals_autograd():
    torch.manual_seed(0)
    model = build_model("logreg", in_features=50).double()
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
    """Mean and per-pixel variance over many draws of one image match RandomCrop(32, 4) + flip."""
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
