"""Model plug-ins: a task's model replaced by the open division's own (``--model FILE.py:build``).

A model plug-in is a callable ``build(input_shape, num_outputs) -> torch.nn.Module`` named as
``FILE.py:NAME``, ``package.module:NAME`` or an entry point of the group ``mlbench.models``
(docs/plugins.md). It serves the classification tasks (1a, 2a), whose runtime calls it instead
of :func:`mlbench.tasks.models.build_model`:

- ``input_shape``: one sample's shape: ``(3, 32, 32)`` for CIFAR-10, ``(features,)`` for epsilon;
- ``num_outputs``: what the task's loss reads per sample: 10 class logits for cross-entropy
  (output ``[N, 10]``), one logit for task 2a's logistic loss (output ``[N]``).

Its source travels with the run as an optimizer plug-in's does (:mod:`mlbench.plugins`); this
module checks that the spec names a callable (the CLI, before a run exists) and, in a worker,
that what it builds is a module with outputs of the task's shape, one line each otherwise.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlbench.errors import UsageError
from mlbench.plugins import Loaded, PluginError, entry_points, installed, last_line, load, load_copy, plugin_label

if TYPE_CHECKING:
    from torch import nn

#: The entry-point group an installed package registers its models in.
ENTRY_POINT_GROUP = "mlbench.models"
#: How errors name this kind of plug-in.
NOUN = "model plug-in"


@dataclass(frozen=True)
class ModelPlugin:
    """A model plug-in as read from its source: where from, the bytes, the builder."""

    loaded: Loaded
    builder: Callable[..., Any]

    @property
    def name(self) -> str:
        """An entry point's name; else the file's stem or the module, and the callable's name."""
        if self.loaded.kind == "entry-point":
            raw = self.loaded.spec
        else:
            raw = f"{self.loaded.module or Path(self.loaded.origin).stem}.{self.loaded.attr}"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)[-64:]

    @property
    def sha256(self) -> str:
        return self.loaded.sha256

    @property
    def label(self) -> str:
        """The run's model everywhere (its task spec, status, compare): name and source."""
        return plugin_label(self.name, self.sha256)

    @property
    def copy_path(self) -> str:
        return self.loaded.copy_path

    def record(self) -> dict[str, Any]:
        """What run.json says of the plug-in (``config.model_plugin``)."""
        return {"name": self.name, **self.loaded.source_record(), "callable": self.loaded.attr}


def is_builtin_model(spec: str) -> bool:
    from mlbench.tasks.models import MODEL_NAMES

    return spec.strip().lower() in MODEL_NAMES + tuple(f"resnet{d}" for d in (20, 32, 44, 56))


def resolve_model(spec: str) -> ModelPlugin | None:
    """None for a built-in model's name; else the plug-in ``spec`` names, loaded and checked to
    be callable, or a UsageError in one line."""
    if is_builtin_model(spec):
        return None

    def unknown() -> str:
        from mlbench.tasks.models import MODEL_NAMES

        plugins = sorted(entry_points(ENTRY_POINT_GROUP))
        known = ", ".join(MODEL_NAMES) + (f"; plug-ins: {', '.join(plugins)}" if plugins else "")
        return (f"unknown model {spec!r}; choose one of: {known}, or give a plug-in as FILE.py:NAME "
                "or package.module:NAME")

    loaded = load(spec, noun=NOUN, group=ENTRY_POINT_GROUP, unknown=unknown)
    return ModelPlugin(loaded, _builder(loaded.obj, loaded.attr, spec, loaded.where))


def installed_models() -> list[dict[str, Any]]:
    """Every entry point of :data:`ENTRY_POINT_GROUP` with its source's file and SHA-256, or why it
    cannot be used; none of them imported (``mlbench tasks``)."""
    return installed(ENTRY_POINT_GROUP, is_builtin_model, "model")


def describe_installed_models() -> list[dict[str, Any]]:
    """The installed model plug-ins as `mlbench tasks` lists them: ``name`` (what --model takes),
    the entry point's ``value`` and ``distribution``, and the source's ``sha256`` and ``origin``,
    or why it cannot be used (``error``); their code is not run (``--model NAME`` runs it, and
    refuses a builder it cannot use before the run exists)."""
    return [{"name": row["entry_point"], **{key: row[key] for key in ("value", "distribution", "origin", "sha256",
                                                                       "error") if key in row}}
            for row in installed_models()]


def load_recorded_model(run_dir: Path, record: dict[str, Any]) -> Callable[..., Any]:
    """The builder of the model plug-in a run recorded, executed from the run folder's copy (a
    worker), its SHA-256 checked as :func:`mlbench.plugins.load_copy` does."""
    return load_copy(run_dir, record, NOUN, str(record["callable"]), _builder)


def build_plugin_model(builder: Callable[..., Any], label: str, input_shape: tuple[int, ...],
                       num_outputs: int, output_shape: Callable[[int], tuple[int, ...]]) -> nn.Module:
    """``builder(input_shape, num_outputs)``, checked: a ``torch.nn.Module`` whose output for a
    batch of 2 zero samples has ``output_shape(2)`` (evaluated in eval mode without gradients, so
    that no BatchNorm statistic or random number is used). A failure is one PluginError line
    naming the plug-in; the traceback goes to the worker's log."""
    import torch

    try:
        model = builder(tuple(input_shape), num_outputs)
    except Exception as err:
        traceback.print_exc()
        raise PluginError(f"{NOUN} {label} raised while building the model: {last_line(err)}") from err
    if not isinstance(model, torch.nn.Module):
        raise PluginError(f"{NOUN} {label} returned {type(model).__name__}, not a torch.nn.Module")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = model(torch.zeros(2, *input_shape))
    except Exception as err:
        traceback.print_exc()
        raise PluginError(f"{NOUN} {label}: its model raised on a batch of shape "
                          f"{[2, *input_shape]}: {last_line(err)}") from err
    finally:
        model.train(was_training)
    shape = tuple(getattr(output, "shape", ()))
    if not isinstance(output, torch.Tensor) or shape != output_shape(2):
        got = list(shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise PluginError(f"{NOUN} {label}: its model gives {got} for a batch of shape {[2, *input_shape]}; "
                          f"the task's loss needs a tensor of shape {list(output_shape(2))}")
    return model


def _builder(obj: Any, name: str, spec: str, where: str) -> Callable[..., Any]:
    if obj is None:
        raise UsageError(f"{NOUN} {spec}: {where} defines no {name}")
    if not callable(obj):
        raise UsageError(f"{NOUN} {spec}: {name} is a {type(obj).__name__}, not a callable "
                         "build(input_shape, num_outputs) -> torch.nn.Module")
    return obj
