"""Task 3a's numbers: Merity et al. 2018 for Wikitext-2, with the batch and rates of MLBench 3a.

Torch-free: the CLI checks ``--set`` values against these fields and records them; the worker's
runtime (:mod:`.runtime`) reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mlbench.tasks.spec import TrainingSettings


@dataclass(frozen=True, kw_only=True)
class LanguageModelSettings(TrainingSettings):
    """AWD-LSTM on Wikitext-2 with SGD, then averaged SGD (the defaults are the closed division)."""

    dataset: str = "wikitext2"
    batch_per_worker: int = 20
    max_epochs: int = 750
    weight_decay: float = 1.2e-6
    eval_batch: int = 10
    bptt: int = 70
    lr: float = 15.0                 # x sqrt(workers), x seq_len / bptt
    asgd_lr: float = 15.0            # x seq_len / bptt
    grad_clip: float = 0.25
    ar_alpha: float = 2.0
    tar_beta: float = 1.0
    nonmono: int = 5
    embedding: int = 400
    hidden: int = 1150
    layers: int = 3
    dropout: float = 0.4
    dropout_h: float = 0.2
    dropout_i: float = 0.65
    dropout_e: float = 0.1
    weight_drop: float = 0.5
    #: ``--data synthetic``: random streams of Wikitext-2's sizes (train, valid) and vocabulary.
    synthetic_tokens: tuple[int, int] = (2_088_628, 217_646)
    synthetic_vocab: int = 33_278

    NOT_SETTABLE: ClassVar[tuple[str, ...]] = ("synthetic_vocab",)
    RATE_FIELDS: ClassVar[tuple[str, ...]] = ("lr",)
    #: The averaged gradient is clipped to norm ``grad_clip`` between the all-reduce and the update.
    needs_averaged_gradient: ClassVar[bool] = True

    def describe_rate(self) -> str:
        return (f"{self.lr:g} x sqrt(k), x seq_len / bptt per batch; "
                f"{self.asgd_lr:g} x seq_len / bptt once averaging")

    def peak_lr(self, workers: int) -> float:
        """The SGD phase's ``lr x sqrt(k)``, at a batch of ``bptt`` tokens."""
        return self.lr * math.sqrt(workers)

    def mllog_hyperparameters(self, workers: int) -> dict[str, Any]:
        return {**super().mllog_hyperparameters(workers), "opt_base_learning_rate": self.lr * math.sqrt(workers),
                "opt_learning_rate_schedule": "base * sqrt(k) * seq_len / bptt"}
