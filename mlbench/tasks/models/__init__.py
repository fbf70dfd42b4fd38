"""The models of the benchmark tasks, built by name.

Names (see :data:`MODEL_NAMES`): ``resnet{20,32,44,56}-v{1,2}`` for task 1a (ResNet for
CIFAR-10, He et al. 2015 / 2016; ``resnetNN`` alone means v1, the closed-division default) and
``logreg`` for task 2a (L2 logistic regression). Names are the stable interface used by the
task specs, ``--model`` overrides and ``mlbench tasks``; the classes live in
:mod:`.resnet` and :mod:`.logreg`, imported when a model is built (or one of them is asked for),
so that the CLI can list and check model names without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlbench.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

    from mlbench.tasks.task2a.model import LogisticRegression
    from mlbench.tasks.task1a.model import ResNetCIFAR

#: The depths of task 1a (6n+2 with n = 3, 5, 7, 9).
RESNET_DEPTHS: tuple[int, ...] = (20, 32, 44, 56)

#: Every valid model name, in the order shown by ``--help`` and ``mlbench tasks``.
MODEL_NAMES: tuple[str, ...] = tuple(
    f"resnet{depth}-v{version}" for version in (1, 2) for depth in RESNET_DEPTHS
) + ("logreg",)

_RESNETS: dict[str, tuple[int, int]] = {
    f"resnet{depth}-v{version}": (depth, version)
    for version in (1, 2)
    for depth in RESNET_DEPTHS
}
# The bare depth means v1, the version task 1a's closed division prescribes.
_RESNETS.update({f"resnet{depth}": (depth, 1) for depth in RESNET_DEPTHS})

__all__ = [
    "MODEL_NAMES",
    "RESNET_DEPTHS",
    "LogisticRegression",
    "ResNetCIFAR",
    "build_model",
    "count_trainable_parameters",
    "resnet_layout",
]


def __getattr__(name: str) -> Any:
    """The model classes, imported on first use (PEP 562)."""
    if name == "LogisticRegression":
        from mlbench.tasks.task2a.model import LogisticRegression

        return LogisticRegression
    if name == "ResNetCIFAR":
        from mlbench.tasks.task1a.model import ResNetCIFAR

        return ResNetCIFAR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_model(name: str, num_classes: int = 10, in_features: int | None = None) -> nn.Module:
    """Build a freshly initialised model by name.

    Args:
        name: one of :data:`MODEL_NAMES`, or ``resnetNN`` for ``resnetNN-v1``
            (case and surrounding spaces are ignored).
        num_classes: classifier outputs of the ResNets; ``logreg`` always has one logit.
        in_features: input features of ``logreg`` (required there, unused by the ResNets,
            whose input is fixed to 3-channel images).

    Raises:
        UsageError: unknown name, ``logreg`` without a positive ``in_features``, or
            ``num_classes`` < 1.
    """
    key = name.strip().lower()
    if key == "logreg":
        if in_features is None or in_features < 1:
            raise UsageError(
                f"Model 'logreg' needs the number of input features as a positive integer "
                f"(in_features), got {in_features!r}."
            )
        from mlbench.tasks.task2a.model import LogisticRegression

        return LogisticRegression(in_features)
    if key in _RESNETS:
        if num_classes < 1:
            raise UsageError(f"num_classes must be a positive integer, got {num_classes!r}.")
        depth, version = _RESNETS[key]
        from mlbench.tasks.task1a.model import ResNetCIFAR

        return ResNetCIFAR(depth, version=version, num_classes=num_classes)
    raise UsageError(
        f"Unknown model {name!r}; valid models are: {', '.join(MODEL_NAMES)} "
        f"(resnetNN alone means resnetNN-v1)."
    )


def resnet_layout(name: str) -> tuple[int, int] | None:
    """(depth, version) of a ResNet model name (``resnet20-v1``, ``resnet20``), None for another
    model: what a port to another framework builds its ResNet from, torch-free."""
    return _RESNETS.get(name.strip().lower())


def count_trainable_parameters(model: nn.Module) -> int:
    """Number of scalars in the parameters that require gradients (BN running stats excluded).

    This is the figure the benchmark quotes for its models (e.g. 272,474 for ResNet-20 v1) and
    the number of elements all-reduced per step by synchronous SGD.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
