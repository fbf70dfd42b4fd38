"""The runtimes of the language tasks, built from their specs: 3a (AWD-LSTM language model) and
4b (Transformer translation).

The numbers live in the task spec (docs/tasks.md, tasks 3a and 4b): the batch, the rate rule,
the weight decay and the epoch cap as fields, the rest in ``spec.extra`` (``--set extra.NAME=V``
changes one, making the run open division). Here they become the runtimes' settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mlbench.run_config import RunConfig
from mlbench.tasks.spec import TaskSpec
from mlbench.timing import PhaseTimer
from mlbench.worker.runtimes import register_runtime


def _settings(cls: type, spec: TaskSpec, **fields: Any) -> Any:
    """``cls``'s defaults, replaced by the spec's extra values and by ``fields``."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in spec.extra.items() if k in names}
    values.update({k: v for k, v in fields.items() if k in names})
    return cls(**values)


@register_runtime("language-model")
def build_language_model(config: RunConfig, rank: int, device: torch.device, timer: PhaseTimer) -> Any:
    from mlbench.tasks.language_model import LanguageModelRuntime, LanguageModelSettings

    spec = config.training_spec
    settings = _settings(LanguageModelSettings, spec, batch_per_worker=spec.batch_per_worker, lr=spec.lr.base)
    return LanguageModelRuntime(settings, data_dir=config.data_dir, synthetic=config.data == "synthetic",
                                rank=rank, world=config.workers, device=device, seed=config.seed, timer=timer)


@register_runtime("translation")
def build_translation(config: RunConfig, rank: int, device: torch.device, timer: PhaseTimer) -> Any:
    from mlbench.tasks.translation import TranslationRuntime, TranslationSettings

    spec = config.training_spec
    precision = "bf16" if config.precision == "bf16" else "auto"
    settings = _settings(TranslationSettings, spec, max_tokens=spec.batch_per_worker, lr=spec.lr.base,
                         warmup_steps=spec.lr.warmup_steps, precision=precision)
    return TranslationRuntime(settings, data_dir=config.data_dir, synthetic=config.data == "synthetic",
                              rank=rank, world=config.workers, device=device, seed=config.seed, timer=timer)
