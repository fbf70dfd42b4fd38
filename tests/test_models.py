"""Models of tasks 1a and 2a: exact parameter counts, shapes, layouts and name handling."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from mlbench.errors import UsageError
from mlbench.tasks.models import (
    MODEL_NAMES,
    LogisticRegression,
    ResNetCIFAR,
    build_model,
    count_trainable_parameters,
)

# v1-20, v1-56 and v2-20 are the benchmark's published figures; the others follow from the same
# layouts (v2 = v1 - 96: the first BN of the two downsampling blocks acts on 16/32 channels).
EXPECTED_PARAMETERS = {
    "resnet20-v1": 272_474,
    "resnet32-v1": 466_906,
    "resnet44-v1": 661_338,
    "resnet56-v1": 855_770,
    "resnet20-v2": 272_378,
    "resnet32-v2": 466_810,
    "resnet44-v2": 661_242,
    "resnet56-v2": 855_674,
}


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Run these batch-of-2 forwards on one thread, restoring the setting afterwards.

    They gain nothing from intra-op parallelism, and OpenMP threads that spin-wait on a busy
    2-core machine (other tests or workers running) make them ten times slower.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_model_names_cover_all_resnets_and_logreg() -> None:
    assert set(MODEL_NAMES) == set(EXPECTED_PARAMETERS) | {"logreg"}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMETERS))
def test_resnet_trainable_parameters_are_exact(name: str) -> None:
    assert count_trainable_parameters(build_model(name)) == EXPECTED_PARAMETERS[name]


def test_bare_depth_means_v1() -> None:
    model = build_model("resnet20")
    assert isinstance(model, ResNetCIFAR) and model.version == 1 and model.depth == 20
    assert count_trainable_parameters(model) == 272_474
    assert build_model(" ResNet56-V2 ").version == 2


def test_frozen_parameters_are_not_counted() -> None:
    model = build_model("resnet20-v1")
    model.classifier.requires_grad_(False)
    assert count_trainable_parameters(model) == 272_474 - 650


@pytest.mark.parametrize("name", ["resnet20-v1", "resnet20-v2", "resnet56-v2"])
def test_resnet_output_shape(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()


def test_num_classes_sets_classifier_width() -> None:
    out = build_model("resnet32-v1", num_classes=100).eval()(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 100)


@pytest.mark.parametrize("name", ["resnet20-v1", "resnet20-v2"])
def test_channels_last_matches_contiguous(name: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    # Train mode too: BN batch statistics must not depend on the memory layout.
    contiguous = build_model(name)
    channels_last = build_model(name).to(memory_format=torch.channels_last)
    channels_last.load_state_dict(contiguous.state_dict())
    x_cl = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        for mode in (True, False):
            contiguous.train(mode)
            channels_last.train(mode)
            torch.testing.assert_close(
                channels_last(x_cl), contiguous(x), rtol=1e-4, atol=1e-5
            )


def test_v1_layout_post_activation_with_projection_shortcuts() -> None:
    model = build_model("resnet20-v1")
    first_down = model.stages[1][0]
    assert isinstance(first_down.shortcut, nn.Sequential)
    conv, bn = first_down.shortcut
    assert (conv.kernel_size, conv.stride, conv.in_channels, conv.out_channels) == (
        (1, 1), (2, 2), 16, 32
    )
    assert bn.num_features == 32
    assert first_down.bn1.num_features == 32
    assert isinstance(model.stages[0][0].shortcut, nn.Identity)
    assert model.stem[0].bias is None


def test_v2_layout_pre_activation_on_input_channels() -> None:
    model = build_model("resnet20-v2")
    assert [stage[0].bn1.num_features for stage in model.stages] == [16, 16, 32]
    assert isinstance(model.stem[1], nn.BatchNorm2d)
    assert model.stages[2][0].shortcut[1].num_features == 64


def test_resnet_initialisation() -> None:
    torch.manual_seed(0)
    model = build_model("resnet56-v1")
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert torch.equal(module.bias, torch.zeros_like(module.bias))
    # Kaiming normal, fan_out: std = sqrt(2 / (out_channels * 3 * 3)) = sqrt(2 / 576) for 64 ch.
    weight = model.stages[2][1].conv1.weight
    assert weight.std().item() == pytest.approx((2 / 576) ** 0.5, rel=0.05)


def test_resnet_trains_one_step() -> None:
    torch.manual_seed(0)
    model = build_model("resnet20-v2")
    loss = nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_logreg_is_one_logit_per_sample() -> None:
    model = build_model("logreg", in_features=7)
    assert isinstance(model, LogisticRegression)
    assert isinstance(model.linear, nn.Linear)
    assert count_trainable_parameters(model) == 7
    out = model(torch.randn(5, 7))
    assert out.shape == (5,)
    # Zero start: every sample scores 0, i.e. probability 1/2 and log-loss log 2.
    assert torch.equal(out, torch.zeros(5))


def test_logreg_is_the_linear_map_without_bias() -> None:
    torch.manual_seed(0)
    model = build_model("logreg", in_features=2000)
    assert model.linear.bias is None  # as the original MLBench's model and task 2a's objective
    with torch.no_grad():
        model.linear.weight.normal_()
    x = torch.randn(3, 2000, dtype=torch.float64)
    model = model.double()
    expected = x @ model.linear.weight[0]
    torch.testing.assert_close(model(x), expected)


def test_logreg_requires_in_features() -> None:
    with pytest.raises(UsageError, match="in_features"):
        build_model("logreg")
    with pytest.raises(UsageError, match="in_features"):
        build_model("logreg", in_features=0)


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UsageError) as info:
        build_model("resnet18")
    message = str(info.value)
    assert "resnet18" in message
    for name in MODEL_NAMES:
        assert name in message


def test_bad_num_classes_is_usage_error() -> None:
    with pytest.raises(UsageError, match="num_classes"):
        build_model("resnet20-v1", num_classes=0)
