"""Task 4b on one worker: the Transformer on WMT17 en-de with synchronous Adam.

The recipe of Vaswani et al. 2017 ("big") with the settings of the original MLBench task:

* token-bucketed micro-batches of at most 2^13 padded tokens per worker, accumulated to a global
  batch of 2^17 tokens (:mod:`mlbench.tasks.task4b.bucketing`; the same global batches for every worker count);
* label-smoothed cross entropy (Szegedy et al. 2016, eps = 0.1; torch's formulation), summed
  over the target tokens and divided by the number of target tokens of the whole global batch
  over all workers; each worker's contribution is multiplied by k because the optimizer
  averages the gradients over the k workers, so the update uses sum / total exactly;
* the rate rises linearly from 0 to 1.976e-3 over 1,000 steps, then decays with the inverse
  square root of the step (fairseq's ``inverse_sqrt``; Vaswani et al. Eq. 3's shape);
  Adam's betas (0.9, 0.98) and eps 1e-9 are the optimizer's (``settings.optimizer_values()``);
* mixed precision (:mod:`mlbench.tasks.precision`): bf16 autocast on GPUs that have it, else fp16 with
  dynamic loss scaling, fp32 on the CPU;
* evaluation on newstest2014: the per-token negative log-likelihood (no smoothing) and BLEU of
  beam-search translations (beam 4, length penalty 0.6, at most source length + 50 tokens,
  Sec. 6.1), detokenised by the BPE model and scored as sacreBLEU does (:mod:`.bleu`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
import dataclasses
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from mlbench.errors import DataError
from mlbench.tasks.task4b.beam_search import beam_search
from mlbench.tasks.task4b.bleu import STATISTICS, bleu_from_statistics, bleu_statistics
from mlbench.tasks.task4b.bpe import BOS, EOS, PAD, Side
from mlbench.tasks.task4b.bucketing import GlobalBatches, accumulation, steps_problem, token_batches
from mlbench.tasks.data.sharding import eval_shard
from mlbench.tasks.flops import ANALYTIC_X3, transformer_flops
from mlbench.tasks.task4b.model import Transformer
from mlbench.tasks.precision import DynamicLossScaler, autocast, autocast_off, choose_precision
from mlbench.tasks.runtime import RunView, all_reduce_sum
from mlbench.tasks.task4b.settings import TranslationSettings
from mlbench.timing import PhaseTimer


class MicroBatch(NamedTuple):
    src: torch.Tensor       # [n, S] source tokens + EOS, right-padded
    tgt_in: torch.Tensor    # [n, T] BOS + target tokens
    tgt_out: torch.Tensor   # [n, T] target tokens + EOS
    tokens: int             # target tokens (without padding)


class TranslationStep(NamedTuple):
    micro: list[MicroBatch]   # this worker's share of the global batch
    total_tokens: int         # target tokens of the whole global batch, all workers


def collate(src: Side, tgt: Side, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, tgt_in, tgt_out) int64 arrays of the pairs ``ids``, right-padded with PAD."""
    src_len, tgt_len = src.lengths()[ids] + 1, tgt.lengths()[ids] + 1
    s = np.full((len(ids), int(src_len.max())), PAD, dtype=np.int64)
    t_in = np.full((len(ids), int(tgt_len.max())), PAD, dtype=np.int64)
    t_out = t_in.copy()
    for row, i in enumerate(ids.tolist()):
        a, b = src.sentence(i), tgt.sentence(i)
        s[row, :len(a)], s[row, len(a)] = a, EOS
        t_in[row, 0], t_in[row, 1:len(b) + 1] = BOS, b
        t_out[row, :len(b)], t_out[row, len(b)] = b, EOS
    return s, t_in, t_out


class TranslationRuntime:
    """Task 4b on worker ``rank`` of ``world`` (see :class:`mlbench.tasks.runtime.TaskRuntime`)."""

    metric_name = "bleu"
    higher_is_better = True

    def __init__(self, settings: TranslationSettings = TranslationSettings(), *, data_dir: str | None = None,
                 synthetic: bool = False, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu"), seed: int = 0, timer: PhaseTimer | None = None):
        problem = settings.check(world)
        if problem:
            raise DataError(f"task4b: {problem}")
        self.s, self.rank, self.world, self.device, self.seed = settings, rank, world, device, seed
        self.timer = timer or PhaseTimer(device, enabled=False)
        self.precision = choose_precision(device, settings.precision)
        self._load(data_dir, synthetic)
        src, tgt = self.train_sides
        batches = token_batches(src.lengths() + 1, tgt.lengths() + 1, max_tokens=settings.batch_per_worker,
                                max_len=settings.max_len, multiple=settings.batch_multiple, seed=seed)
        problem = steps_problem(len(batches), world, global_tokens=settings.global_tokens,
                                max_tokens=settings.batch_per_worker, max_len=settings.max_len)
        if problem:
            raise DataError(f"task4b: {problem}")
        self.schedule = GlobalBatches(batches, world, accumulation(world, settings.global_tokens,
                                                                         settings.batch_per_worker))
        self._batch_tokens = np.array([int(tgt.lengths()[b].sum()) + len(b) for b in batches], dtype=np.int64)
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.model = Transformer(self.vocab_size, settings.dim, settings.ffn, settings.heads,
                                 settings.encoder_layers, settings.decoder_layers, settings.dropout,
                                 settings.attention_dropout, settings.activation_dropout, pad_id=PAD,
                                 max_positions=max(1024, settings.max_len + settings.decode_extra + 2)
                                 ).to(device)
        self.scaler = (DynamicLossScaler([p for p in self.model.parameters() if p.requires_grad], device)
                       if self.precision == "fp16" else None)
        self._attached: Any = None
        self._epoch = 0

    def _load(self, data_dir: str | None, synthetic: bool) -> None:
        if synthetic:
            self.vocab_size = self.s.vocab_size
            rng = np.random.default_rng(self.seed)
            sides = [self._random_side(rng, n) for n in self.s.synthetic_pairs for _ in range(2)]
            self.train_sides, self.test_sides = (sides[0], sides[1]), (sides[2], sides[3])
            self.references = [" ".join(map(str, sides[3].sentence(i).tolist())) for i in range(len(sides[3]))]
            self.detokenize = lambda ids: " ".join(map(str, ids))
            return
        from mlbench.tasks.task4b.bpe import encode_wmt17
        from mlbench.tasks.task4b.wmt import LANGS, TEST, TRAIN, wmt17_folder

        corpus = encode_wmt17(wmt17_folder(data_dir), self.s.vocab_size)
        self.vocab_size = corpus.vocab_size
        source, target = LANGS
        self.train_sides = (corpus.splits[TRAIN][source], corpus.splits[TRAIN][target])
        self.test_sides = (corpus.splits[TEST][source], corpus.splits[TEST][target])
        self.references = corpus.references
        processor = corpus.processor()
        self.detokenize = processor.decode

    @property
    def test_samples(self) -> int:
        """Test sentences translated per evaluation (the MLLOG's eval_samples)."""
        return len(self.test_sides[0])

    def _random_side(self, rng: np.random.Generator, n: int) -> Side:
        lengths = rng.integers(4, 80, n)
        tokens = rng.integers(EOS + 1, self.s.vocab_size, int(lengths.sum())).astype(np.int32)
        return Side(tokens, np.concatenate([[0], np.cumsum(lengths)]))

    # -- the interface --------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return self.schedule.steps_per_epoch()

    def begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def batches(self, epoch: int) -> Iterator[TranslationStep]:
        order = self.schedule.epoch_order(self.seed, epoch)
        for step_ids in order:
            total = int(self._batch_tokens[step_ids].sum())
            yield TranslationStep([self._micro(self.schedule.batches[i])
                                   for i in self.schedule.share(step_ids, self.rank)], total)

    def _micro(self, ids: np.ndarray) -> MicroBatch:
        src, t_in, t_out = (torch.from_numpy(a).to(self.device, non_blocking=True)
                            for a in collate(*self.train_sides, ids))
        return MicroBatch(src, t_in, t_out, int((t_out != PAD).sum()))

    def lr(self, step: int, batch: Any = None) -> float:
        """Linear warm-up from 0 over ``warmup_steps``, then ``lr * sqrt(warmup / step)``."""
        warmup = self.s.warmup_steps
        if step < warmup:
            return self.s.lr * step / warmup
        return self.s.lr * math.sqrt(warmup / step)

    def train_step(self, batch: TranslationStep, lr: float, optimizer: Any) -> torch.Tensor:
        if self.scaler is not None and optimizer is not self._attached:
            optimizer.set_grad_hook(self.scaler.unscale_and_check, "unscale fp16 gradients (task 4b)")
            self._attached = optimizer
        module = optimizer.module
        self.timer.begin()
        optimizer.zero_grad()
        self.timer.mark("data")  # the micro-batches were collated when the step was drawn
        loss_sum = torch.zeros((), device=self.device)
        # One autocast context for all the micro-batches: autocast keeps its bf16/fp16 copy of
        # each weight until its outermost context ends, so the weights are cast once per step,
        # not once per micro-batch (16 times: 8,800 copies, 83 ms of GPU time in an H200's 0.8 s
        # step). The weights change only in the update, after the context. Each backward pass
        # runs with autocast off (the autograd engine would otherwise take the caller's autocast
        # state), as before: the gradients are those of one context per forward pass, bit for
        # bit but for the embedding shared with the output layer, whose two paths are added in
        # another order (a test pins both).
        with autocast(self.device, self.precision):
            for j, mb in enumerate(batch.micro):
                # DDP all-reduces once, with the last micro-batch's backward.
                last = j == len(batch.micro) - 1
                sync = contextlib.nullcontext() if last or not hasattr(module, "no_sync") else module.no_sync()
                with sync:
                    logits = module(mb.src, mb.tgt_in)
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), mb.tgt_out.reshape(-1),
                                           ignore_index=PAD, label_smoothing=self.s.label_smoothing,
                                           reduction="sum")
                    self.timer.mark("forward")
                    with autocast_off(self.device, self.precision):
                        scaled = loss * (self.world / batch.total_tokens)
                        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                    self.timer.mark("backward")
                loss_sum += loss.detach().float()
        optimizer.step(lr)
        return loss_sum / max(1, self.samples_in(batch))

    def samples_in(self, batch: TranslationStep) -> int:
        return sum(mb.tokens for mb in batch.micro)

    def flops_per_step(self) -> tuple[int, str]:
        """FLOPs of this worker's mean step and how they were counted (:mod:`mlbench.tasks.flops`):
        3 x the forward passes of its micro-batches in their padded shapes, averaged over its
        steps of the first epoch (steps differ in their sentences' lengths), rounded."""
        src, tgt = self.train_sides
        src_len, tgt_len = src.lengths() + 1, tgt.lengths() + 1  # + EOS; BOS + target
        s = self.s
        per_batch = [transformer_flops(len(ids), int(src_len[ids].max()), int(tgt_len[ids].max()), dim=s.dim,
                                       ffn=s.ffn, encoder_layers=s.encoder_layers,
                                       decoder_layers=s.decoder_layers, vocab=self.vocab_size)
                     for ids in self.schedule.batches]
        order = self.schedule.epoch_order(self.seed, 0)
        steps = max(1, len(order))
        total = 3 * sum(per_batch[i] for ids in order for i in self.schedule.share(ids, self.rank).tolist())
        return (total + steps // 2) // steps, ANALYTIC_X3

    def state_dict(self) -> dict[str, Any]:
        """The fp16 loss scale and its growth counter (nothing else: batches follow from (seed, epoch))."""
        return {"scaler": self.scaler.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.scaler.load_state_dict(state["scaler"])

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """newstest2014 negative log-likelihood per target token and BLEU, over all workers."""
        src_side, tgt_side = self.test_sides
        n = len(src_side) if self.s.eval_sentences is None else min(self.s.eval_sentences, len(src_side))
        lo, hi = eval_shard(n, workers=self.world, rank=self.rank)
        ids = np.arange(lo, hi)
        ids = ids[np.argsort(src_side.lengths()[ids], kind="stable")]
        self.model.eval()
        nll, tokens, hypotheses, references = 0.0, 0, [], []
        for start in range(0, len(ids), self.s.eval_batch):
            chunk = ids[start:start + self.s.eval_batch]
            src, t_in, t_out = (torch.from_numpy(a).to(self.device) for a in collate(src_side, tgt_side, chunk))
            with autocast(self.device, self.precision):
                logits = self.model(src, t_in)
                nll += float(F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), t_out.reshape(-1),
                                             ignore_index=PAD, reduction="sum"))
                best = beam_search(self.model, src, beam=self.s.beam, alpha=self.s.length_penalty,
                                   max_len=(src != PAD).sum(1) - 1 + self.s.decode_extra, bos=BOS, eos=EOS, pad=PAD)
            tokens += int((t_out != PAD).sum())
            hypotheses += [self.detokenize(h.tokens) for h in best]
            references += [self.references[i] for i in chunk.tolist()]
        self.model.train()
        totals = all_reduce_sum([nll, float(tokens), *map(float, bleu_statistics(hypotheses, references))],
                                self.world, self.device)
        loss = totals[0] / max(totals[1], 1.0)
        return {"loss": loss, "bleu": bleu_from_statistics(totals[2:2 + STATISTICS])}


def build_runtime(config: RunView, rank: int, device: torch.device, timer: PhaseTimer) -> TranslationRuntime:
    """What the worker calls: the runtime of the run's (possibly overridden) task 4b settings,
    in bf16 where the run asks for it (else the best precision of the device)."""
    settings = config.training_spec.settings
    assert isinstance(settings, TranslationSettings)
    precision = "bf16" if config.precision == "bf16" else "auto"
    return TranslationRuntime(dataclasses.replace(settings, precision=precision), data_dir=config.data_dir,
                              synthetic=config.data == "synthetic", rank=rank, world=config.workers,
                              device=device, seed=config.seed, timer=timer)
