"""Task 5a's numbers: GPT-2 small pretrained on FineWeb-10B, the recipe of llm.c's reproduction.

Every value is llm.c's GPT-2 (124M) run (Karpathy 2024, "Reproducing GPT-2 (124M) in llm.c",
karpathy/llm.c discussion #481: ``-b 64 -t 1024 -d 524288 -l 0.0006 -u 700 -q 0.0 -c 0.1 -x 19073``
over FineWeb's 10B sample), which the modded-nanogpt speedrun takes as its baseline: it ended
at 3.2847 validation loss (modded-nanogpt's README); the speedrun's goal, this task's, is 3.28.
Torch-free: the CLI checks ``--set`` values against these fields and records
them; the worker's runtime (:mod:`.runtime`) reads them.

An "epoch" of this task is ``eval_every`` steps, the interval between two evaluations (llm.c
evaluates every 250 steps), so that the trainer's evaluation at each epoch's end comes when the
recipe's does; the data are one stream of tokens that the steps walk through (:mod:`.shards`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mlbench.tasks.spec import TrainingSettings


@dataclass(frozen=True, kw_only=True)
class GPTSettings(TrainingSettings):
    """GPT-2 small on FineWeb with data-parallel AdamW (the defaults are the closed division).

    ``global_batch`` sequences of ``context`` tokens make a step whatever the worker count: each
    worker takes micro-batches of ``batch_per_worker`` sequences and accumulates
    ``global_batch / (batch_per_worker x workers)`` of them (:meth:`accumulation`).
    """

    dataset: str = "fineweb10B"
    batch_per_worker: int = 64            # sequences per micro-batch (llm.c's -b 64 per GPU)
    max_epochs: int = 0                   # derived: ceil(steps / eval_every)
    weight_decay: float = 0.1             # AdamW's, on the matrices only
    layers: int = 12
    head_dim: int = 64                    # 12 heads at width 768
    width: int = 768
    context: int = 1024
    vocab_size: int = 50_257              # GPT-2's tokens
    padded_vocab: int = 50_304            # embedding rows: a multiple of 128
    global_batch: int = 512               # sequences per step: 524,288 tokens
    lr: float = 6e-4
    min_lr: float = 0.0                   # llm.c's -q 0.0: cosine decay to 0
    warmup_steps: int = 700
    steps: int = 19_073                   # 10B tokens / 524,288
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_tokens: int = 10_485_760         # llm.c's 20 batches of 64 x 1024 on 8 GPUs
    precision: str = "auto"               # bf16 autocast on GPUs, fp32 on CPUs
    #: ``--data synthetic``: random tokens (train, validation).
    synthetic_tokens: tuple[int, int] = (20_000_000, 10_485_761)

    NOT_SETTABLE: ClassVar[tuple[str, ...]] = ("max_epochs",)
    RATE_FIELDS: ClassVar[tuple[str, ...]] = ("lr", "min_lr", "warmup_steps", "steps")
    #: The averaged gradient is clipped to norm ``grad_clip`` between the all-reduce and the update.
    needs_averaged_gradient: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_epochs", max(1, math.ceil(self.steps / max(1, self.eval_every))))

    def check(self, workers: int) -> str | None:
        """Why these settings cannot run on ``workers`` workers (None: they can)."""
        if self.width % self.head_dim:
            return f"width {self.width} is not a multiple of head_dim {self.head_dim}"
        if self.padded_vocab < self.vocab_size:
            return f"padded_vocab {self.padded_vocab} is below vocab_size {self.vocab_size}"
        per_pass = self.batch_per_worker * workers
        if self.global_batch % per_pass:
            return (f"a global batch of {self.global_batch} sequences is not a whole number of micro-batches "
                    f"of {self.batch_per_worker} sequences on each of {workers} workers: set global_batch to a "
                    f"multiple of {per_pass}, or batch_per_worker so that batch_per_worker x {workers} divides it")
        return None

    def accumulation(self, workers: int) -> int:
        """Micro-batches per step on each of ``workers`` workers."""
        return self.global_batch // (self.batch_per_worker * workers)

    def global_batch_size(self, workers: int) -> int:
        """Sequences per step, whatever the worker count (MLPerf's LLM logs count sequences)."""
        return self.global_batch

    @property
    def heads(self) -> int:
        """Attention heads: width / head_dim (12 for GPT-2 small)."""
        return self.width // self.head_dim

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.context

    def learning_rate(self, step: int) -> float:
        """llm.c's schedule at ``step`` (0-based): linear warm-up to ``lr`` over ``warmup_steps``
        (``lr (step + 1) / warmup``), then a cosine from ``lr`` to ``min_lr`` at ``steps``."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if step >= self.steps:
            return self.min_lr
        ratio = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)

    def peak_lr(self, workers: int) -> float:
        """``lr``, reached at the end of the warm-up."""
        return self.lr

    def describe_rate(self) -> str:
        return (f"{self.lr:g}, warmed up linearly over {self.warmup_steps} steps, then a cosine to "
                f"{self.min_lr:g} at step {self.steps}")

    def optimizer_values(self) -> dict[str, float]:
        return {"beta1": self.adam_beta1, "beta2": self.adam_beta2, "eps": self.adam_eps, "lr_scale": 1.0}

    def mllog_hyperparameters(self, workers: int) -> dict[str, Any]:
        return {"opt_weight_decay": self.weight_decay, "opt_base_learning_rate": self.lr,
                "opt_learning_rate_warmup_steps": self.warmup_steps, "opt_end_learning_rate": self.min_lr,
                "opt_learning_rate_decay_steps": self.steps, "opt_adamw_beta_1": self.adam_beta1,
                "opt_adamw_beta_2": self.adam_beta2, "opt_adamw_epsilon": self.adam_eps,
                "opt_gradient_clip_norm": self.grad_clip, "max_sequence_length": self.context,
                "opt_learning_rate_schedule": "linear warm-up, then cosine to the end rate"}

    def with_values(self, values: dict[str, Any]) -> GPTSettings:
        return dataclasses.replace(self, **values)
