"""Mixed precision for task 4b: bf16 where the GPU has it, else fp16 with dynamic loss scaling.

SPEC's task 4b trains in mixed precision with dynamic loss scaling (Micikevicius et al. 2018,
"Mixed Precision Training", ICLR). On a GPU with bf16 (compute capability 8.0 and later) the
forward pass runs under ``torch.autocast`` in bf16, whose range is fp32's, so no scaling is
needed; on older GPUs it runs in fp16 and the loss is scaled by ``torch.amp.GradScaler``; on
the CPU the run is fp32. The choice is recorded with the run (``TranslationRuntime.precision``).

GradScaler expects a ``torch.optim`` optimizer, while the update of an mlbench run belongs to a
distributed optimizer that averages the gradients first. :class:`DynamicLossScaler` therefore
hands GradScaler a stand-in (:class:`_UpdateGate`) that owns the parameters and whose ``step``
only records that GradScaler allows the update, and runs as the distributed optimizer's gradient
hook: after the all-reduce, when every rank holds the same averaged gradient (an inf or NaN on
any rank reaches all of them through the sum), so every rank skips the same steps and keeps the
same scale without a collective of its own.
"""

from __future__ import annotations

import contextlib

import torch

from mlbench.errors import UsageError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def choose_precision(device: torch.device, requested: str = "auto") -> str:
    """"fp32" on the CPU, "bf16" on a GPU that has it, else "fp16"; or what was requested."""
    if requested not in PRECISIONS:
        raise UsageError(f"precision {requested!r}: expected one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def autocast(device: torch.device, precision: str):
    """The forward pass's context: autocast to bf16/fp16, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def autocast_off(device: torch.device, precision: str):
    """Inside :func:`autocast`: a region with autocast off (a backward pass, as torch recommends)
    that does not end the outer context, whose cache of cast weights lives on."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


class _UpdateGate:
    """What GradScaler reads of an optimizer: the parameters, and a ``step`` that GradScaler
    calls only when no gradient overflowed."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.param_groups = [{"params": params}]
        self.allowed = False

    def step(self) -> None:
        self.allowed = True


class DynamicLossScaler:
    """fp16 loss scaling for a distributed optimizer (torch's GradScaler defaults: initial scale
    2^16, halved on an overflow, doubled after 2,000 steps without one)."""

    def __init__(self, params: list[torch.nn.Parameter], device: torch.device):
        self.scaler = torch.amp.GradScaler(device.type)
        self.gate = _UpdateGate(params)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale_and_check(self) -> bool:
        """The gradient hook: unscale the averaged gradients, update the scale; True when the
        update may go ahead (no inf/NaN)."""
        self.gate.allowed = False
        self.scaler.step(self.gate)  # type: ignore[arg-type]  # a stand-in: GradScaler reads only param_groups, step
        self.scaler.update()
        return self.gate.allowed

    def get_scale(self) -> float:
        return float(self.scaler.get_scale())
