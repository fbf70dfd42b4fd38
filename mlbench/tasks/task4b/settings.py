"""Task 4b's numbers: Vaswani et al. 2017 "big", with the batches and rate of MLBench 4b.

Torch-free: the CLI checks ``--set`` values against these fields and records them; the worker's
runtime (:mod:`.runtime`) and the data preparation (the BPE vocabulary) read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mlbench.tasks.spec import TrainingSettings


@dataclass(frozen=True, kw_only=True)
class TranslationSettings(TrainingSettings):
    """The Transformer on WMT17 en-de with Adam (the defaults are the closed division).

    ``batch_per_worker`` counts tokens: the micro-batches of one worker hold at most that many
    padded tokens, accumulated to ``global_tokens`` per step over all workers.
    """

    dataset: str = "wmt17-en-de"
    batch_per_worker: int = 2 ** 13
    max_epochs: int = 10
    vocab_size: int = 32_768
    global_tokens: int = 2 ** 17
    batch_multiple: int = 8
    max_len: int = 80
    lr: float = 1.976e-3
    warmup_steps: int = 1000
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    adam_lr_scale: float = 1.0
    label_smoothing: float = 0.1
    beam: int = 4
    length_penalty: float = 0.6
    decode_extra: int = 50              # translations of at most source length + 50 tokens
    eval_sentences: int | None = None   # None: all of newstest2014 (3,003)
    eval_batch: int = 64                # sentences per beam-search batch
    dim: int = 1024
    ffn: int = 4096
    heads: int = 16
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation_dropout: float = 0.1
    precision: str = "auto"             # auto | fp32 | bf16 | fp16 (from the run's --precision)
    #: ``--data synthetic``: random sentence pairs (train, test) of 4..79 tokens.
    synthetic_pairs: tuple[int, int] = (40_000, 64)

    #: The data set is prepared (BPE-encoded) with this vocabulary before the workers start.
    NOT_SETTABLE: ClassVar[tuple[str, ...]] = ("vocab_size",)
    RATE_FIELDS: ClassVar[tuple[str, ...]] = ("lr", "warmup_steps")

    def describe_rate(self) -> str:
        return (f"{self.lr:g}, warmed up linearly from 0 over {self.warmup_steps} steps, then "
                f"x sqrt({self.warmup_steps} / step)")

    def peak_lr(self, workers: int) -> float:
        """``lr``, reached at the end of the warm-up."""
        return self.lr

    def check(self, workers: int) -> str | None:
        if self.max_len > self.batch_per_worker:
            return (f"max_len {self.max_len} exceeds batch_per_worker {self.batch_per_worker}: a pair that long fits "
                    "no micro-batch; --set a larger batch_per_worker or a smaller max_len")
        return None

    def check_data(self, prepared: object, workers: int) -> str | None:
        """Whether the BPE-encoded corpus (:class:`.bpe.EncodedCorpus`) makes one global step."""
        from mlbench.tasks.task4b.bpe import EncodedCorpus
        from mlbench.tasks.task4b.bucketing import corpus_problem
        from mlbench.tasks.task4b.wmt_layout import LANGS, TRAIN

        if not isinstance(prepared, EncodedCorpus):
            return None
        src, tgt = (prepared.splits[TRAIN][lang] for lang in LANGS)
        return corpus_problem(src.lengths() + 1, tgt.lengths() + 1, workers, global_tokens=self.global_tokens,
                              max_tokens=self.batch_per_worker, max_len=self.max_len, multiple=self.batch_multiple)

    def optimizer_values(self) -> dict[str, float]:
        return {"beta1": self.adam_beta1, "beta2": self.adam_beta2, "eps": self.adam_eps,
                "lr_scale": self.adam_lr_scale}

    def mllog_hyperparameters(self, workers: int) -> dict[str, Any]:
        return {**super().mllog_hyperparameters(workers), "opt_base_learning_rate": self.lr,
                "opt_learning_rate_warmup_steps": self.warmup_steps,
                "opt_learning_rate_schedule": "linear warm-up, then base * sqrt(warmup_steps / t)"}
