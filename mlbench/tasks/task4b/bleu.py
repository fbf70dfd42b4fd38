"""BLEU (Papineni et al. 2002) as sacreBLEU computes it (Post 2018, arXiv:1804.08771), over workers.

Corpus BLEU is a function of ten sums over the sentences: matched and total n-grams for n = 1..4,
the hypothesis length and the reference length. Each worker translates its share of the test
set and computes these sums with sacreBLEU on detokenised text (its default ``13a`` tokenizer
and ``exp`` smoothing, i.e. ``sacrebleu.corpus_bleu``); the sums are all-reduced and the score
comes from sacreBLEU's ``BLEU.compute_bleu``, so k workers report exactly the BLEU one process
computing ``corpus_bleu`` over the whole test set would.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlbench.extras import needs

#: Sums per shard: matched n-grams (4), total n-grams (4), hypothesis length, reference length.
STATISTICS = 10


def _bleu_class():
    with needs("nlp"):
        from sacrebleu.metrics import BLEU
    return BLEU


def bleu_statistics(hypotheses: list[str], references: list[str]) -> list[int]:
    """The ten sums of one shard (zeros for an empty shard)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        return [0] * STATISTICS
    score = _bleu_class()().corpus_score(hypotheses, [references])
    return [*score.counts, *score.totals, score.sys_len, score.ref_len]


def bleu_from_statistics(stats: list[int] | list[float]) -> float:
    """Corpus BLEU (0..100) from summed statistics, with sacreBLEU's default smoothing."""
    stats = [round(s) for s in stats]
    return _bleu_class().compute_bleu(stats[0:4], stats[4:8], stats[8], stats[9], smooth_method="exp").score


def distributed_bleu(hypotheses: list[str], references: list[str], world: int,
                     device: torch.device | None = None, group=None) -> float:
    """BLEU over the union of every rank's (hypothesis, reference) pairs (``device``: where the
    backend all-reduces, e.g. CUDA for NCCL)."""
    stats = torch.tensor(bleu_statistics(hypotheses, references), dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
    return bleu_from_statistics(stats.tolist())
