"""Beam search for task 4b's evaluation: beam 4, length penalty 0.6.

Vaswani et al. 2017 (Sec. 6.1) translate with "beam search with a beam size of 4 and length
penalty alpha = 0.6", the penalty of Wu et al. 2016 (GNMT, Eq. 14): a finished hypothesis Y is
scored ``log P(Y | X) / lp(Y)`` with ``lp(Y) = ((5 + |Y|) / 6) ** alpha``, |Y| counting its tokens
including EOS. That is also what the original MLBench reference (a fork of fairseq's
``SequenceGenerator``) computes. The search follows that generator:

* each step ranks the 2 x beam best one-token extensions over all live hypotheses of a sentence;
  an EOS among the first ``beam`` of them finishes that hypothesis; the best ``beam`` extensions
  that are not EOS live on;
* a sentence is done when it has ``beam`` finished hypotheses (fairseq's ``stop_early``) or when
  it reached its maximum length, where only EOS may follow; EOS may not come before
  ``min_len`` tokens; padding and BOS are never generated;
* the answer is the finished hypothesis with the best score.

The decoder runs incrementally (cached keys and values); finished sentences leave the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mlbench.tasks.task4b.model import Transformer, reorder_cache


@dataclass
class Hypothesis:
    tokens: list[int]   # without BOS and EOS
    score: float        # log-probability / length penalty


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp for a hypothesis of ``length`` tokens including EOS."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, *, beam: int, alpha: float,
                max_len: torch.Tensor | int, bos: int, eos: int, pad: int, min_len: int = 1) -> list[Hypothesis]:
    """Best translation of every source sentence (``src`` [B, S], right-padded); ``max_len``:
    the most tokens before EOS, per sentence or for all."""
    n, device = src.size(0), src.device
    limit = torch.as_tensor(max_len, device=device).expand(n).clamp(max=model.max_positions - 1)
    memory, mask = model.encode(src)
    memory, mask = memory.repeat_interleave(beam, 0), mask.repeat_interleave(beam, 0)
    alive = torch.arange(n, device=device)                   # sentences still searched
    tokens = torch.full((n * beam, 1), bos, dtype=torch.long, device=device)
    scores = torch.full((n, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0                                       # one live hypothesis at the start
    cache = model.new_cache()
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    for step in range(int(limit.max()) + 1):
        logp = F.log_softmax(model.decode_step(tokens[:, -1:], step, memory, mask, cache).float(), dim=-1)
        vocab = logp.size(1)
        logp[:, [pad, bos]] = float("-inf")
        if step < min_len:
            logp[:, eos] = float("-inf")
        ending = (limit[alive] <= step).repeat_interleave(beam)
        if ending.any():                                     # at the maximum length only EOS
            eos_logp = logp[ending, eos]
            logp[ending] = float("-inf")
            logp[ending, eos] = eos_logp
        live = alive.numel()
        cand = (scores.view(-1, 1) + logp).view(live, beam * vocab)
        top, index = cand.topk(min(2 * beam, beam * vocab), dim=1)
        origin, token = index // vocab, index % vocab
        is_eos = (token == eos) & torch.isfinite(top)
        penalty = length_penalty(step + 1, alpha)
        for i, c in is_eos[:, :beam].nonzero().tolist():
            sentence = finished[int(alive[i])]
            if len(sentence) < beam:
                row = i * beam + int(origin[i, c])
                sentence.append(Hypothesis(tokens[row, 1:].tolist(), float(top[i, c]) / penalty))
        next_scores, pick = top.masked_fill(is_eos, float("-inf")).topk(beam, dim=1)
        rows = (torch.arange(live, device=device)[:, None] * beam + origin.gather(1, pick)).view(-1)
        tokens = torch.cat([tokens[rows], token.gather(1, pick).view(-1, 1)], dim=1)
        scores = next_scores
        cache = reorder_cache(cache, rows)
        done = torch.tensor([len(finished[int(s)]) >= beam for s in alive], device=device)
        done |= (limit[alive] <= step) | ~torch.isfinite(scores).any(dim=1)
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().view(-1)
            keep_rows = (keep[:, None] * beam + torch.arange(beam, device=device)).view(-1)
            alive, scores, tokens = alive[keep], scores[keep], tokens[keep_rows]
            memory, mask = memory[keep_rows], mask[keep_rows]
            cache = reorder_cache(cache, keep_rows)
    return [max(hyps, key=lambda h: h.score) if hyps else Hypothesis([], float("-inf")) for hyps in finished]
