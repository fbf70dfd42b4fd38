"""A distributed optimizer's own state, as a checkpoint keeps it and a resume puts it back.

What an optimizer carries from one step to the next differs by method: momentum buffers (in a
torch optimizer, or flat ones of its own), PowerSGD's Q matrices and error feedback, the error
memory of sign and top-k compression, a random generator, step counters, the bytes sent so far.
Rather than each optimizer (and each plug-in) writing its own save and load, and forgetting one
attribute, :func:`capture` walks the optimizer's attributes and keeps everything that is state:
tensors, torch optimizers (their ``state_dict``), random generators, numbers, and the same inside
lists, dicts and mlbench's own helper objects (a compressor, a momentum). It leaves out what is
built again from the run's configuration (the model, its parameters, the context, the options).
:func:`restore` writes it back: a tensor of the same shape in place (a captured CUDA graph
reads that very tensor), anything else by assignment.

A method whose state lives elsewhere (a torch communication hook's state) overrides
``state_dict``/``load_state_dict`` of :class:`mlbench.optim.base.DistributedOptimizer`.
"""

from __future__ import annotations

from typing import Any

import torch

#: Attributes rebuilt from the configuration, never saved.
SKIPPED = frozenset({"ctx", "opts", "module", "params", "grad_hook", "info", "timer", "graph", "consensus"})
_PLAIN = (int, float, bool, str, type(None))
_MAX_DEPTH = 6


#: Keys that mark what a captured value was (plain dicts, so that the checkpoint loads with
#: ``torch.load(weights_only=True)``).
_OBJECT, _GENERATOR, _OPTIMIZER = "__object__", "__generator__", "__optimizer__"


def _ours(value: Any, owner_module: str) -> bool:
    """A helper object whose attributes are state: one of mlbench's, or of the plug-in's module."""
    module = type(value).__module__
    return (hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module) and not callable(value)
            and (module.startswith("mlbench.") or module == owner_module))


def _value(value: Any, owner_module: str, skip: set[int], depth: int) -> Any:
    if isinstance(value, torch.Tensor):
        return None if id(value) in skip else value.detach().to("cpu", copy=True)
    if isinstance(value, torch.optim.Optimizer):
        return {_OPTIMIZER: value.state_dict()}
    if isinstance(value, torch.Generator):
        return {_GENERATOR: value.get_state()}
    if isinstance(value, _PLAIN):
        return value
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(value, (list, tuple)):
        return [_value(v, owner_module, skip, depth + 1) for v in value]
    if isinstance(value, dict) and all(isinstance(k, _PLAIN) for k in value):
        return {k: _value(v, owner_module, skip, depth + 1) for k, v in value.items()}
    if _ours(value, owner_module):
        return _attributes(value, owner_module, skip, depth + 1)
    return None


def _attributes(obj: Any, owner_module: str, skip: set[int], depth: int) -> dict[str, Any]:
    return {_OBJECT: {name: _value(v, owner_module, skip, depth) for name, v in vars(obj).items()
                      if name not in SKIPPED}}


def capture(optimizer: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The state of ``optimizer`` (CPU copies; the model's own parameters and buffers are the
    model's checkpoint, not repeated here)."""
    skip = {id(t) for t in (*model.parameters(), *model.buffers())}
    return _attributes(optimizer, type(optimizer).__module__, skip, 0)[_OBJECT]


def restore(optimizer: Any, state: dict[str, Any]) -> None:
    """Put ``state`` (from :func:`capture`) back into an optimizer built for the same run."""
    _restore_attributes(optimizer, state)


def _restore_attributes(obj: Any, state: dict[str, Any]) -> None:
    for name, saved in state.items():
        current = getattr(obj, name, None)
        setattr(obj, name, _restored(current, saved))


def _restored(current: Any, saved: Any) -> Any:
    if saved is None:
        return current
    if isinstance(saved, torch.Tensor):
        if isinstance(current, torch.Tensor) and current.shape == saved.shape and current.dtype == saved.dtype:
            with torch.no_grad():
                current.copy_(saved)
            return current
        device = current.device if isinstance(current, torch.Tensor) else None
        return saved.to(device) if device is not None else saved
    if isinstance(saved, dict) and _GENERATOR in saved:
        generator = current if isinstance(current, torch.Generator) else torch.Generator()
        generator.set_state(saved[_GENERATOR])
        return generator
    if isinstance(saved, dict) and _OPTIMIZER in saved:
        if isinstance(current, torch.optim.Optimizer):
            current.load_state_dict(saved[_OPTIMIZER])
        return current
    if isinstance(saved, dict) and _OBJECT in saved:
        if current is not None and hasattr(current, "__dict__"):
            _restore_attributes(current, saved[_OBJECT])
        return current
    if isinstance(saved, dict):
        target = current if isinstance(current, dict) else {}
        for key, value in saved.items():
            target[key] = _restored(target.get(key), value)
        return target
    if isinstance(saved, list):
        if isinstance(current, list) and len(current) == len(saved):
            for i, value in enumerate(saved):
                current[i] = _restored(current[i], value)
            return current
        if isinstance(current, tuple) and len(current) == len(saved):
            return tuple(_restored(c, v) for c, v in zip(current, saved))
        return [_restored(None, v) for v in saved]
    return saved
