"""ResNet for CIFAR-10 (task 1a): 6n+2 layers, versions v1 and v2.

The CIFAR variant of He et al. 2015, "Deep Residual Learning for Image Recognition" (Sec. 4.2):
a 3x3 stem convolution to 16 channels, three stages of ``n`` basic blocks with 16, 32 and 64
channels (the first block of stages 2 and 3 halves the feature map with stride 2), global
average pooling and a linear classifier. Depth 6n+2 gives ResNet-20/32/44/56 for n = 3/5/7/9.

* **v1** (He et al. 2015): post-activation blocks ``conv-BN-ReLU-conv-BN``, add, ``ReLU``.
  Where the shape changes the shortcut is a projection (option B of the paper: 1x1 conv with
  stride 2, then BN); elsewhere it is the identity. ResNet-20 has 272,474 trainable parameters.
* **v2** (He et al. 2016, "Identity Mappings in Deep Residual Networks"): pre-activation blocks
  ``BN-ReLU-conv-BN-ReLU-conv``, add, nothing after the addition.

The v2 layout is the one of the original MLBench reference implementation
(mlbench-core, ``mlbench_core/models/pytorch/resnet.py``, ``ResNetCIFAR`` with
``BasicBlockV2``), because the benchmark's published number, 272,378 trainable parameters for
ResNet-20 v2, is that implementation's, and results are only comparable on the same model:

* the stem is ``conv-BN-ReLU`` exactly as in v1 (32 BN parameters);
* the first BN of every block acts on the block's *input* channels, so in the downsampling
  blocks of stages 2 and 3 it has 16 and 32 channels instead of 32 and 64 (96 fewer
  parameters than v1, hence 272,474 - 96 = 272,378);
* the projection shortcut is ``1x1 conv stride 2 + BN`` applied to the block's raw input (not to
  its pre-activation), as in v1;
* there is no extra ``BN-ReLU`` between the last addition and the pooling.

A layout closer to the text of the 2016 paper (stem conv without BN, projection shortcut
without BN, an extra BN-ReLU before the pooling) would have 272,474 - 32 - 96 - 192 + 128 =
272,282 parameters, so the published count pins the reference layout above.

Initialisation follows both papers and torchvision: Kaiming-normal (fan_out, ReLU gain) for
every convolution, BN weight 1 and bias 0; the classifier keeps PyTorch's default.
"""

from __future__ import annotations

import torch
from torch import nn

#: Output channels of the three stages (He et al. 2015, Sec. 4.2).
STAGE_CHANNELS: tuple[int, int, int] = (16, 32, 64)


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (a BN always follows or precedes it)."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


def _projection(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    """Projection shortcut, option B of He et al. 2015: 1x1 conv with the block's stride + BN."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    )


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """Identity where the shape stays, a projection where it changes (both versions)."""
    if stride != 1 or in_channels != out_channels:
        return _projection(in_channels, out_channels, stride)
    return nn.Identity()


class BasicBlockV1(nn.Module):
    """Post-activation basic block of He et al. 2015 (Fig. 2): conv-BN-ReLU-conv-BN, add, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual branch plus shortcut, then the post-addition ReLU of v1."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class BasicBlockV2(nn.Module):
    """Pre-activation basic block of He et al. 2016 (Fig. 4e): BN-ReLU-conv-BN-ReLU-conv, add.

    ``bn1`` normalises the block input, so it has ``in_channels`` features; the shortcut sees the
    raw input, as in the MLBench reference (see the module docstring).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activated residual branch plus shortcut; nothing after the addition (clean path)."""
        out = self.conv1(self.relu(self.bn1(x)))
        out = self.conv2(self.relu(self.bn2(out)))
        return out + self.shortcut(x)


class ResNetCIFAR(nn.Module):
    """ResNet-(6n+2) for 32x32 images, v1 or v2 (layouts in the module docstring).

    Args:
        depth: 20, 32, 44, 56, ... (any 6n+2 with n >= 1).
        version: 1 (He et al. 2015) or 2 (He et al. 2016).
        num_classes: outputs of the linear classifier (10 for CIFAR-10).
    """

    def __init__(self, depth: int, version: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"ResNet-CIFAR depth must be 6n+2 with n >= 1, got {depth}")
        if version not in (1, 2):
            raise ValueError(f"ResNet version must be 1 or 2, got {version}")
        self.depth = depth
        self.version = version
        blocks_per_stage = (depth - 2) // 6
        block = BasicBlockV1 if version == 1 else BasicBlockV2

        first = STAGE_CHANNELS[0]
        self.stem = nn.Sequential(
            _conv3x3(3, first), nn.BatchNorm2d(first), nn.ReLU(inplace=True)
        )
        stages: list[nn.Module] = []
        in_channels = first
        for index, channels in enumerate(STAGE_CHANNELS):
            stride = 1 if index == 0 else 2
            layers = [block(in_channels, channels, stride)]
            layers += [block(channels, channels) for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*layers))
            in_channels = channels
        self.stages = nn.Sequential(*stages)
        # Adaptive pooling averages whatever spatial size is left (8x8 for 32x32 inputs) and
        # works unchanged on channels_last tensors.
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(in_channels, num_classes)

        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape [N, num_classes] for images of shape [N, 3, H, W]."""
        x = self.stages(self.stem(x))
        return self.classifier(torch.flatten(self.pool(x), 1))
