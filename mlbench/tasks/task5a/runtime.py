"""Task 5a on one worker: GPT-2 small pretrained on FineWeb with data-parallel AdamW.

The recipe of llm.c's GPT-2 (124M) run (:mod:`.settings` says where each number comes from):

* a step is ``global_batch`` sequences of ``context`` tokens whatever the worker count: this
  worker's micro-batches are its parts of the step's sequences (:func:`.shards.worker_sequences`),
  their gradients accumulated as the mean over the step's tokens, so that k workers compute the
  step of one process with the whole batch;
* the loss is the mean cross-entropy of the next token; AdamW (betas 0.9/0.95, eps 1e-8, weight
  decay 0.1 on the matrices, :func:`.model.decayed`) on the all-reduced gradient, clipped to norm
  1.0 between the all-reduce and the update (the optimizer's gradient hook);
* the rate: linear warm-up over 700 steps, then a cosine to 0 at step 19,073
  (:meth:`.settings.GPTSettings.learning_rate`);
* bf16 autocast on GPUs that have it, fp32 on CPUs (:mod:`mlbench.tasks.precision`);
* validation: the mean cross-entropy over the first ``eval_tokens`` tokens of the validation
  shard, cut into sequences of ``context`` (shared among the workers, summed and all-reduced),
  every ``eval_every`` steps (an "epoch" of this task) and at the end.

The place in the data is a function of the step alone, so a checkpoint needs nothing beyond
the model and the optimizer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pathlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from mlbench.errors import DataError
from mlbench.tasks.data.sharding import eval_shard
from mlbench.tasks.precision import autocast, autocast_off, choose_precision
from mlbench.tasks.runtime import RunView, all_reduce_sum
from mlbench.tasks.task5a import fineweb
from mlbench.tasks.task5a.model import FLOPS_PER_TOKEN, GPT, flops_per_token
from mlbench.tasks.task5a.settings import GPTSettings
from mlbench.tasks.task5a.shards import (TRAIN_PATTERN, VAL_PATTERN, TokenStream, find_shards, load_tokens,
                                         worker_sequences)
from mlbench.timing import PhaseTimer


class MicroBatch(NamedTuple):
    inputs: torch.Tensor    # [sequences, context] token ids
    targets: torch.Tensor   # the same, one token later


class GPTStep(NamedTuple):
    step: int
    micro: list[MicroBatch]


def shard_folder(data_dir: str | None) -> pathlib.Path:
    """Where the shards are: ``--data-dir``, or the data root's ``fineweb10B`` (downloaded there)."""
    return pathlib.Path(data_dir).expanduser() if data_dir is not None else fineweb.default_root()


def open_shards(folder: pathlib.Path) -> tuple[TokenStream, np.ndarray]:
    """The train stream and the validation tokens of the shards in ``folder``."""
    train, val = find_shards(folder, TRAIN_PATTERN), find_shards(folder, VAL_PATTERN)
    if not train or not val:
        raise DataError(f"{folder} holds no {'train' if not train else 'validation'} shard "
                        f"({TRAIN_PATTERN if not train else VAL_PATTERN}); run `mlbench data download fineweb10B` "
                        "or pass --data-dir DIR with the shards")
    return TokenStream(train), load_tokens(val[0])


class _Synthetic:
    """Random tokens in place of the train stream (``--data synthetic``, for throughput)."""

    def __init__(self, tokens: np.ndarray):
        self.tokens, self.total = tokens, len(tokens)

    def read(self, offset: int, count: int) -> np.ndarray:
        index = (offset + np.arange(count)) % self.total
        return self.tokens[index].astype(np.int64)


def _at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """The logits for the loss: bf16 or fp16 widened to fp32, fp32 or float64 (tests) as they are."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


class GPTRuntime:
    """Task 5a on worker ``rank`` of ``world`` (see :class:`mlbench.tasks.runtime.TaskRuntime`)."""

    metric_name = "val_loss"
    higher_is_better = False

    def __init__(self, settings: GPTSettings = GPTSettings(), *, data_dir: str | None = None,
                 synthetic: bool = False, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu"), seed: int = 0, timer: PhaseTimer | None = None):
        problem = settings.check(world)
        if problem:
            raise DataError(problem)
        self.s, self.rank, self.world, self.device, self.seed = settings, rank, world, device, seed
        self.timer = timer or PhaseTimer(device, enabled=False)
        self.precision = choose_precision(device, settings.precision)
        self.accumulation = settings.accumulation(world)
        if synthetic:
            rng = np.random.default_rng(seed)
            n_train, n_val = settings.synthetic_tokens
            self.train: Any = _Synthetic(rng.integers(0, settings.vocab_size, n_train, dtype=np.int64))
            self.val = rng.integers(0, settings.vocab_size, n_val, dtype=np.int64)
        else:
            self.train, self.val = open_shards(shard_folder(data_dir))
        # The same seed on every rank: all workers start from the same weights.
        torch.manual_seed(seed)
        self.model = GPT(layers=settings.layers, heads=settings.heads, width=settings.width,
                         context=settings.context, vocab=settings.padded_vocab).to(device)
        self._attached: Any = None

    # -- the interface --------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return self.s.eval_every

    def begin_epoch(self, epoch: int) -> None:
        pass

    def batches(self, epoch: int) -> Iterator[GPTStep]:
        first = epoch * self.s.eval_every
        for step in range(first, min(first + self.s.eval_every, self.s.steps)):
            yield GPTStep(step, [self._micro_batch(step, m) for m in range(self.accumulation)])

    def _micro_batch(self, step: int, micro: int) -> MicroBatch:
        s = self.s
        sequences = worker_sequences(micro, self.rank, self.world, s.batch_per_worker)
        start = step * s.tokens_per_step + sequences.start * s.context
        tokens = self.train.read(start, len(sequences) * s.context + 1)
        if tokens.size and int(tokens.max()) >= s.padded_vocab:
            raise DataError(f"the training data hold token id {int(tokens.max())}, beyond the model's "
                            f"{s.padded_vocab} embedding rows (--set padded_vocab)")
        buf = torch.from_numpy(tokens)
        inputs = buf[:-1].view(len(sequences), s.context).to(self.device, non_blocking=True)
        targets = buf[1:].view(len(sequences), s.context).to(self.device, non_blocking=True)
        return MicroBatch(inputs, targets)

    def lr(self, step: int, batch: GPTStep) -> float:
        return self.s.learning_rate(batch.step)

    def train_step(self, batch: GPTStep, lr: float, optimizer: Any) -> torch.Tensor:
        if optimizer is not self._attached:
            optimizer.set_grad_hook(self._clip, f"clip the averaged gradient (task 5a, norm {self.s.grad_clip})")
            self._attached = optimizer
        module = optimizer.module
        self.timer.begin()
        optimizer.zero_grad()
        self.timer.mark("data")  # the micro-batches were read when the step was drawn
        loss_sum = torch.zeros((), device=self.device)
        with autocast(self.device, self.precision):
            for j, mb in enumerate(batch.micro):
                last = j == len(batch.micro) - 1
                sync = contextlib.nullcontext() if last or not hasattr(module, "no_sync") else module.no_sync()
                with sync:
                    logits = module(mb.inputs)
                    loss = F.cross_entropy(_at_least_fp32(logits).view(-1, logits.size(-1)), mb.targets.reshape(-1))
                    self.timer.mark("forward")
                    with autocast_off(self.device, self.precision):
                        (loss / len(batch.micro)).backward()
                    self.timer.mark("backward")
                loss_sum += loss.detach()
        optimizer.step(lr)
        return loss_sum / len(batch.micro)

    def samples_in(self, batch: GPTStep) -> int:
        """The tokens this worker trained on in the step."""
        return sum(int(mb.inputs.numel()) for mb in batch.micro)

    def flops_per_step(self) -> tuple[int, str]:
        """FLOPs of this worker's step: :func:`.model.flops_per_token` x its tokens."""
        tokens = self.accumulation * self.s.batch_per_worker * self.s.context
        return flops_per_token(self.model, self.s.context) * tokens, FLOPS_PER_TOKEN

    @property
    def test_samples(self) -> int:
        """Validation sequences of ``context`` tokens per evaluation, over all workers (the
        MLLOG's eval_samples: MLPerf's LLM logs count sequences, as its global batch does)."""
        return self._eval_sequences()

    def _eval_sequences(self) -> int:
        return min(self.s.eval_tokens, len(self.val) - 1) // self.s.context

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean cross-entropy per validation token, over all workers. Every rank makes the same
        number of forward passes (a rank with one sequence fewer repeats its first and counts it
        not): a sharded model (``fsdp``) gathers its weights in each, with every rank."""
        s = self.s
        sequences = self._eval_sequences()
        lo, hi = eval_shard(sequences, workers=self.world, rank=self.rank)
        passes = math.ceil(math.ceil(sequences / self.world) / s.batch_per_worker)
        self.model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(passes):
            first = lo + i * s.batch_per_worker
            count = min(s.batch_per_worker, hi - first)
            counted = count > 0
            if not counted:
                first, count = lo if hi > lo else 0, 1
            tokens = torch.from_numpy(np.asarray(self.val[first * s.context:(first + count) * s.context + 1],
                                                 dtype=np.int64))
            inputs = tokens[:-1].view(count, s.context).to(self.device)
            targets = tokens[1:].view(count, s.context).to(self.device)
            with autocast(self.device, self.precision):
                logits = self.model(inputs)
            if counted:
                nll += F.cross_entropy(_at_least_fp32(logits).view(-1, logits.size(-1)), targets.reshape(-1),
                                       reduction="sum").double()
        total, predicted = all_reduce_sum([float(nll), float((hi - lo) * s.context)], self.world, self.device)
        self.model.train()
        loss = total / max(1.0, predicted)
        return {"loss": loss, "val_loss": loss}

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the data's place is a function of the step."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def _clip(self) -> bool:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        return True


def build_runtime(config: RunView, rank: int, device: torch.device, timer: PhaseTimer) -> GPTRuntime:
    """What the worker calls: the runtime of the run's (possibly overridden) task 5a settings, in
    bf16 where the run asks for it (else the best precision of the device)."""
    settings = config.training_spec.settings
    assert isinstance(settings, GPTSettings)
    precision = "bf16" if config.precision == "bf16" else settings.precision
    return GPTRuntime(dataclasses.replace(settings, precision=precision), data_dir=config.data_dir,
                      synthetic=config.data == "synthetic", rank=rank, world=config.workers, device=device,
                      seed=config.seed, timer=timer)
