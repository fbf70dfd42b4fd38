"""Task 4b's batches: token buckets that are the same whatever the number of workers.

**Micro-batches** are built once from the sentence lengths, independently of the worker count,
as fairseq's ``batch_by_size`` builds them (Ott et al. 2018, "Scaling Neural Machine
Translation"): the pairs are put in a seeded random order, stably sorted by target then source
length, and cut greedily into batches whose padded size, ``sentences x longest side (with its
EOS)``, stays within ``max_tokens`` (2^13), with the sentence count rounded down to a multiple of
8 when a batch closes. Pairs with an empty side or longer than ``max_len`` (80 tokens with EOS)
are left out.

A **global step** is ``G`` consecutive micro-batches of the epoch's shuffled order (shuffled by
(seed, epoch), the same on every rank); worker r takes the r-th block of ``A = G / k`` of them
and accumulates their gradients. ``A = ceil(global_tokens / (max_tokens * k))`` with
``global_tokens`` = 2^17, so G = 16 for every k dividing 16: k workers then process exactly the
micro-batches one process does, which is what makes k workers equal one process (for other k
the global batch grows to the next multiple of k micro-batches). The total target-token count of
a step, by which the summed loss is divided, is a function of the step's micro-batches, so every
rank knows it without communicating. An epoch's micro-batches that fill no whole step are left
out of it, so a corpus too small for one step is refused before it trains (:func:`steps_problem`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, max_tokens: int, max_len: int,
                  multiple: int = 8, seed: int = 0) -> list[np.ndarray]:
    """Micro-batches of pair indices; lengths count each side's EOS (sentence length + 1)."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    size = np.maximum(src, tgt)
    if max_len > max_tokens:
        raise ValueError(f"max_len {max_len} exceeds max_tokens {max_tokens}: a pair could fit no batch")
    order = np.random.default_rng(seed).permutation(len(size))
    order = order[np.argsort(tgt[order], kind="mergesort")]
    order = order[np.argsort(src[order], kind="mergesort")]
    order = order[(np.minimum(src, tgt)[order] >= 2) & (size[order] <= max_len)]
    batches: list[np.ndarray] = []
    batch: list[int] = []
    longest = 0
    for idx, n in zip(order.tolist(), size[order].tolist()):
        longest = max(longest, n)
        # The batch so far fits; close (the largest multiple-of-8 head of) it while this pair
        # would make it overflow.
        while batch and (len(batch) + 1) * longest > max_tokens:
            keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
            batches.append(np.asarray(batch[:keep], dtype=np.int64))
            batch = batch[keep:]
            longest = max([int(size[i]) for i in batch] + [n])
        batch.append(idx)
    if batch:
        batches.append(np.asarray(batch, dtype=np.int64))
    return batches


def accumulation(world: int, global_tokens: int, max_tokens: int) -> int:
    """Micro-batches each worker accumulates per global step (at least 1)."""
    return max(1, math.ceil(global_tokens / (max_tokens * world)))


def steps_problem(batches: int, world: int, *, global_tokens: int, max_tokens: int, max_len: int) -> str | None:
    """Why an epoch of ``batches`` micro-batches holds no global step on ``world`` workers, and
    what to set (None: it holds one). The tail of an epoch is dropped, so a corpus smaller than
    one global step trains nothing."""
    per_step = world * accumulation(world, global_tokens, max_tokens)
    if batches >= per_step:
        return None
    if batches == 0:
        return (f"the training data hold no sentence pair to train on (both sides non-empty and at most "
                f"{max_len - 1} tokens after BPE, max_len {max_len}); give more sentence pairs")
    have = (f"the training data make {batches} micro-batch{'es' if batches != 1 else ''} of at most {max_tokens:,} "
            f"tokens (batch_per_worker), fewer than the {per_step} of one step of {global_tokens:,} tokens "
            f"(global_tokens) on {world} worker{'s' if world != 1 else ''}")
    fitting = batches // world * world * max_tokens
    if fitting:
        return f"{have}: --set global_tokens={fitting} or less, or give more sentence pairs"
    return f"{have}, fewer than one per worker: run at most {batches} workers, or give more sentence pairs"


def corpus_problem(src_lengths: np.ndarray, tgt_lengths: np.ndarray, world: int, *, global_tokens: int,
                   max_tokens: int, max_len: int, multiple: int = 8) -> str | None:
    """:func:`steps_problem` for the micro-batches :func:`token_batches` makes of these pairs
    (their count does not depend on the seed: the cut follows the sorted lengths). A micro-batch
    holds at most ``max_tokens`` padded tokens, so the pairs' tokens bound the count from below:
    only a corpus under the bound of one step is cut, and a large one is judged in milliseconds."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    size = np.maximum(src, tgt)
    kept = int(size[(np.minimum(src, tgt) >= 2) & (size <= max_len)].sum())
    if math.ceil(kept / max_tokens) >= world * accumulation(world, global_tokens, max_tokens):
        return None
    batches = token_batches(src, tgt, max_tokens=max_tokens, max_len=max_len, multiple=multiple)
    return steps_problem(len(batches), world, global_tokens=global_tokens, max_tokens=max_tokens, max_len=max_len)


@dataclass(frozen=True)
class GlobalBatches:
    """The global steps of an epoch over fixed micro-batches, and each worker's share."""

    batches: list[np.ndarray]
    world: int
    per_worker: int

    @property
    def per_step(self) -> int:
        return self.world * self.per_worker

    def steps_per_epoch(self) -> int:
        return len(self.batches) // self.per_step

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """Micro-batch ids of every global step: int64 [steps, G] (the tail is dropped)."""
        order = np.random.default_rng([seed, epoch]).permutation(len(self.batches))
        steps = self.steps_per_epoch()
        return order[: steps * self.per_step].reshape(steps, self.per_step)

    def share(self, step_ids: np.ndarray, rank: int) -> np.ndarray:
        """This rank's micro-batch ids within one global step."""
        return step_ids[rank * self.per_worker:(rank + 1) * self.per_worker]
