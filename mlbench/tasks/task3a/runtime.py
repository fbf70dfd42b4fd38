"""Task 3a on one worker: AWD-LSTM on Wikitext-2 with synchronous SGD, then averaged SGD.

The training recipe of Merity et al. 2018 ("Regularizing and Optimizing LSTM Language Models",
arXiv:1708.02182) with the distributed settings of the original MLBench task:

* each worker trains on its 20 columns of the batchified token stream (:mod:`mlbench.tasks.task3a.bptt`); the
  hidden state is carried from batch to batch, detached, and reset at each epoch;
* random BPTT lengths (70, or 35 with probability 0.05, then Normal(., 5), at least 5), drawn
  alike on every rank; the rate ``15 x sqrt(k)`` is rescaled per batch by ``seq_len / 70`` so
  that short batches do not count as much as long ones;
* loss = cross entropy + activation regularisation ``2 x mean(h^2)`` on the last layer's
  dropped-out output + temporal activation regularisation ``1 x mean((h_t - h_{t-1})^2)`` on its
  raw output; weight decay 1.2e-6 (applied by the optimizer, from the settings);
* the averaged gradient is clipped to norm 0.25 (the optimizer's gradient hook, after the
  all-reduce, so k workers clip what one process with the k-fold batch would);
* non-monotonically triggered averaged SGD (NT-ASGD, Sec. 3): after an evaluation whose
  validation loss is worse than the best of those before the last five, training goes on at
  rate 15 (also rescaled by ``seq_len / 70``) while an average of the weights since the switch
  is kept (Polyak & Juditsky 1992; torch's ASGD with t0 = 0, lambda = 0); evaluations then use
  the averaged weights;
* validation perplexity = exp(mean negative log-likelihood per token), batch 10, BPTT 70.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F

from mlbench.tasks.task3a.bptt import batchify, bptt_batches, bptt_lengths, eval_lengths, worker_columns
from mlbench.tasks.data.sharding import eval_shard
from mlbench.tasks.flops import ANALYTIC_X3, lstm_language_model_flops
from mlbench.tasks.task3a.model import AWDLSTM, WeightDropLSTM, detach_hidden
from mlbench.tasks.runtime import RunView, all_reduce_sum
from mlbench.tasks.task3a.settings import LanguageModelSettings
from mlbench.timing import PhaseTimer


def nonmonotone_trigger(history: list[float], loss: float, nonmono: int) -> bool:
    """NT-ASGD's condition (Merity et al. 2018, Algorithm 1, as their code applies it): more than
    ``nonmono`` earlier evaluations, and ``loss`` worse than the best of all but the last
    ``nonmono`` of them."""
    return len(history) > nonmono and loss > min(history[:-nonmono])


class LMBatch(NamedTuple):
    data: torch.Tensor      # [seq_len, batch] token ids
    target: torch.Tensor    # [seq_len * batch] next tokens


class LanguageModelRuntime:
    """Task 3a on worker ``rank`` of ``world`` (see :class:`mlbench.tasks.runtime.TaskRuntime`)."""

    metric_name = "perplexity"
    higher_is_better = False

    def __init__(self, settings: LanguageModelSettings = LanguageModelSettings(), *,
                 data_dir: str | None = None, synthetic: bool = False, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu"), seed: int = 0, timer: PhaseTimer | None = None):
        self.s, self.rank, self.world, self.device, self.seed = settings, rank, world, device, seed
        self.timer = timer or PhaseTimer(device, enabled=False)
        train, valid, vocab_size = self._streams(data_dir, synthetic)
        # The same seed on every rank: all workers start from the same weights.
        torch.manual_seed(seed)
        self.model = AWDLSTM(vocab_size, settings.embedding, settings.hidden, settings.layers, settings.dropout,
                             settings.dropout_h, settings.dropout_i, settings.dropout_e,
                             settings.weight_drop).to(device)
        self.vocab_size = vocab_size
        matrix = batchify(train, settings.batch_per_worker * world)
        self.train = worker_columns(matrix, rank, settings.batch_per_worker).to(device)
        valid_matrix = batchify(valid, settings.eval_batch)
        lo, hi = eval_shard(settings.eval_batch, workers=world, rank=rank)
        self.valid = valid_matrix[:, lo:hi].contiguous().to(device)
        self.valid_rows = valid_matrix.size(0)
        self.averaging = False
        self._average: list[torch.Tensor] = []
        self._averaged_steps = 0
        self._history: list[float] = []
        self._attached: Any = None
        self._epoch = -1
        self.begin_epoch(0)

    def _streams(self, data_dir: str | None, synthetic: bool) -> tuple[np.ndarray, np.ndarray, int]:
        if synthetic:
            rng = np.random.default_rng(self.seed)
            n_train, n_valid = self.s.synthetic_tokens
            vocab = self.s.synthetic_vocab
            return rng.integers(0, vocab, n_train), rng.integers(0, vocab, n_valid), vocab
        from mlbench.tasks.task3a.wikitext import load_wikitext2

        corpus = load_wikitext2(data_dir)
        return corpus.train, corpus.valid, len(corpus.vocab)

    # -- the interface --------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return len(self._lengths)

    @property
    def test_samples(self) -> int:
        """Validation tokens predicted per evaluation, over all workers (the MLLOG's eval_samples)."""
        return self.s.eval_batch * (self.valid_rows - 1)

    def begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._lengths = bptt_lengths(self.train.size(0), self.s.bptt, self.seed, epoch)
        self.hidden = self.model.init_hidden(self.s.batch_per_worker)

    def batches(self, epoch: int) -> Iterator[LMBatch]:
        if epoch != self._epoch:
            self.begin_epoch(epoch)
        for data, target in bptt_batches(self.train, self._lengths):
            yield LMBatch(data, target)

    def lr(self, step: int, batch: LMBatch) -> float:
        base = self.s.asgd_lr if self.averaging else self.s.lr * math.sqrt(self.world)
        return base * batch.data.size(0) / self.s.bptt

    def train_step(self, batch: LMBatch, lr: float, optimizer: Any) -> torch.Tensor:
        if optimizer is not self._attached:
            optimizer.set_grad_hook(self._clip, f"clip the averaged gradient (task 3a, norm {self.s.grad_clip})")
            self._attached = optimizer
        self.timer.begin()
        self.timer.mark("data")  # the token matrix is on the device already
        logits, hidden, raw, dropped = optimizer.module(batch.data, detach_hidden(self.hidden))
        self.hidden = detach_hidden(hidden)
        loss = F.cross_entropy(logits, batch.target)
        objective = (loss + self.s.ar_alpha * dropped.pow(2).mean()
                     + self.s.tar_beta * (raw[1:] - raw[:-1]).pow(2).mean())
        self.timer.mark("forward")
        optimizer.zero_grad()
        objective.backward()
        self.timer.mark("backward")
        optimizer.step(lr)
        if self.averaging:
            self._accumulate_average()
        return loss.detach()

    def samples_in(self, batch: LMBatch) -> int:
        """The tokens of the batch (sequence length x sequences): a language model's throughput
        is counted in tokens (the sequences' lengths are random)."""
        return int(batch.data.numel())

    def flops_per_step(self) -> tuple[int, str]:
        """FLOPs of this worker's mean step and how they were counted (:mod:`mlbench.tasks.flops`):
        3 x the forward pass over its columns x the first epoch's mean sequence length (the
        lengths are random, drawn alike every epoch), rounded to an integer."""
        sizes = [self.s.embedding] + [cast(WeightDropLSTM, rnn).hidden_size for rnn in self.model.rnns]
        lengths = bptt_lengths(self.train.size(0), self.s.bptt, self.seed, 0)
        steps = max(1, len(lengths))
        total = 3 * lstm_language_model_flops(self.train.size(1) * sum(lengths), sizes, self.vocab_size)
        return (total + steps // 2) // steps, ANALYTIC_X3

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss and perplexity (with the averaged weights once averaging); decides the
        switch to averaged SGD from the all-reduced loss, so every rank switches together."""
        saved = self._swap_in_average()
        self.model.eval()
        nll = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.valid.size(1):
            hidden = self.model.init_hidden(self.valid.size(1))
            for data, target in bptt_batches(self.valid, eval_lengths(self.valid_rows, self.s.bptt)):
                logits, hidden, _, _ = self.model(data, hidden)
                nll += F.cross_entropy(logits.float(), target, reduction="sum").double()
        count = self.valid.size(1) * (self.valid_rows - 1)
        total, tokens = all_reduce_sum([float(nll), float(count)], self.world, self.device)
        self.model.train()
        for p, value in zip(self.model.parameters(), saved):
            p.copy_(value)  # the training weights back
        loss = total / tokens
        if not self.averaging and nonmonotone_trigger(self._history, loss, self.s.nonmono):
            self.averaging = True
        self._history.append(loss)
        return {"loss": loss, "perplexity": math.exp(loss)}

    def state_dict(self) -> dict[str, Any]:
        """The hidden state carried from batch to batch, and NT-ASGD's switch, average and history."""
        return {"hidden": [tuple(t.detach().clone() for t in layer) for layer in self.hidden],
                "averaging": self.averaging, "average": [t.clone() for t in self._average],
                "averaged_steps": self._averaged_steps, "history": list(self._history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hidden = [tuple(t.to(self.device) for t in layer) for layer in state["hidden"]]
        self.averaging = bool(state["averaging"])
        self._average = [t.to(self.device) for t in state["average"]]
        self._averaged_steps = int(state["averaged_steps"])
        self._history = [float(v) for v in state["history"]]

    # -- clipping and averaging -----------------------------------------------------------------
    def _clip(self) -> bool:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        return True

    @torch.no_grad()
    def _accumulate_average(self) -> None:
        """Running mean of the weights after every averaged-SGD step."""
        self._averaged_steps += 1
        params = list(self.model.parameters())
        if self._averaged_steps == 1:
            self._average = [p.detach().clone() for p in params]
            return
        for avg, p in zip(self._average, params):
            avg.lerp_(p, 1.0 / self._averaged_steps)

    @torch.no_grad()
    def _swap_in_average(self) -> list[torch.Tensor]:
        """Put the averaged weights in the model; return the training weights (none to restore
        before averaging starts)."""
        if not (self.averaging and self._average):
            return []
        params = list(self.model.parameters())
        saved = [p.detach().clone() for p in params]
        for p, avg in zip(params, self._average):
            p.copy_(avg)
        return saved


def build_runtime(config: RunView, rank: int, device: torch.device, timer: PhaseTimer) -> LanguageModelRuntime:
    """What the worker calls: the runtime of the run's (possibly overridden) task 3a settings."""
    settings = config.training_spec.settings
    assert isinstance(settings, LanguageModelSettings)
    return LanguageModelRuntime(settings, data_dir=config.data_dir, synthetic=config.data == "synthetic",
                                rank=rank, world=config.workers, device=device, seed=config.seed, timer=timer)
