"""Training and evaluation pieces of tasks 3a and 4b, checked against values derived by hand or
computed by the reference library (sacreBLEU) and by exhaustive search."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import sacrebleu
import torch
import torch.nn.functional as F

from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task3a.runtime import LanguageModelRuntime, LMBatch, nonmonotone_trigger
from mlbench.tasks.task3a.settings import LanguageModelSettings
from mlbench.tasks.task4b import TASK4B
from mlbench.tasks.task4b.beam_search import beam_search, length_penalty
from mlbench.tasks.task4b.bleu import bleu_from_statistics, bleu_statistics
from mlbench.tasks.task4b.model import Transformer
from mlbench.tasks.task4b.runtime import TranslationRuntime
from mlbench.tasks.task4b.settings import TranslationSettings
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper

CPU = torch.device("cpu")
TINY_LM = LanguageModelSettings(batch_per_worker=4, eval_batch=2, bptt=10, embedding=8, hidden=12, layers=3,
                                synthetic_tokens=(4000, 400), synthetic_vocab=50)
TINY_MT = TranslationSettings(vocab_size=60, batch_per_worker=128, global_tokens=512, max_len=40, dim=16, ffn=32,
                              heads=2, encoder_layers=1, decoder_layers=1, synthetic_pairs=(200, 8))
SGD_3A = TASK1A.with_settings(momentum=0.0, nesterov=False, weight_decay=1.2e-6)


def sgd(model: torch.nn.Module, name: str = "centralized-sgd"):
    return build_optimizer(name, OptimizerContext(model=model, hyper=task_hyper(SGD_3A, 1), world_size=1, rank=0,
                                                  timer=PhaseTimer(CPU, enabled=False)))


# -- learning rates ---------------------------------------------------------------------------
def test_3a_rate_is_15_sqrt_k_rescaled_by_sequence_length():
    runtime = LanguageModelRuntime(TINY_LM, synthetic=True, world=4)
    # 4 workers need 16 columns: the synthetic stream has 4000 tokens, 250 rows
    batch = LMBatch(torch.zeros(35, 4, dtype=torch.long), torch.zeros(140, dtype=torch.long))
    assert runtime.lr(0, batch) == pytest.approx(15 * 2 * 35 / 10)
    runtime.averaging = True  # averaged SGD: rate 15, still rescaled
    assert runtime.lr(0, batch) == pytest.approx(15 * 35 / 10)


@pytest.mark.parametrize("step,rate", [(0, 0.0), (500, 1.976e-3 / 2), (1000, 1.976e-3), (4000, 1.976e-3 / 2)])
def test_4b_rate_warms_up_linearly_from_zero_then_decays_as_inverse_sqrt(step, rate):
    runtime = TranslationRuntime(TINY_MT, synthetic=True)
    # 500: half-way up the ramp; 1000: the peak; 4000: peak * sqrt(1000/4000) = peak / 2
    assert runtime.lr(step) == pytest.approx(rate, rel=1e-12, abs=1e-15)


# -- evaluation metrics -----------------------------------------------------------------------
def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(wikitext_dir):
    runtime = LanguageModelRuntime(TINY_LM, data_dir=str(wikitext_dir))
    with torch.no_grad():
        runtime.model.encoder.weight.zero_()   # tied: every logit is 0
        runtime.model.decoder.bias.zero_()
    result = runtime.evaluate()
    # exp(-mean log(1/V)) = V, up to float32 rounding of log-softmax
    assert result["perplexity"] == pytest.approx(runtime.vocab_size, rel=1e-6)
    assert result["loss"] == pytest.approx(math.log(runtime.vocab_size), rel=1e-6)


HYPOTHESES = ["The cat sat on the mat.", "It is raining today in Berlin, again!", "No match here",
              "Ein Haus ist groß und rot."]
REFERENCES = ["The cat is sitting on the mat.", "Today it is raining in Berlin again!", "Completely different",
              "Das Haus ist groß und rot."]


def test_bleu_of_known_pairs_equals_sacrebleus_corpus_bleu():
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    assert 0 < expected < 100
    assert bleu_from_statistics(bleu_statistics(HYPOTHESES, REFERENCES)) == pytest.approx(expected, abs=1e-12)


def test_bleu_from_shards_summed_equals_bleu_of_the_whole_set():
    shards = [bleu_statistics(HYPOTHESES[:1], REFERENCES[:1]), bleu_statistics(HYPOTHESES[1:], REFERENCES[1:]),
              bleu_statistics([], [])]
    summed = [sum(column) for column in zip(*shards)]
    assert bleu_from_statistics(summed) == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)


# -- beam search ------------------------------------------------------------------------------
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def brute_force(model: Transformer, src: torch.Tensor, max_len: int, alpha: float) -> tuple[list[int], float]:
    """Score every output of 1..max_len tokens (then EOS) by teacher forcing; return the best."""
    words = [t for t in range(model.vocab_size) if t not in (PAD, BOS, EOS)]
    best: tuple[list[int], float] = ([], -math.inf)
    with torch.no_grad():
        for n in range(1, max_len + 1):
            for seq in itertools.product(words, repeat=n):
                logp = F.log_softmax(model(src, torch.tensor([[BOS, *seq]])), dim=-1)[0]
                out = [*seq, EOS]
                score = sum(float(logp[t, out[t]]) for t in range(len(out))) / length_penalty(len(out), alpha)
                if score > best[1]:
                    best = (list(seq), score)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_with_a_beam_covering_every_hypothesis_finds_the_exhaustive_best(seed):
    torch.manual_seed(seed)
    model = Transformer(7, 16, 32, 2, 1, 1, dropout=0, attention_dropout=0, activation_dropout=0).eval()
    src = torch.tensor([[4, 5, 6, EOS], [5, 5, EOS, PAD]])
    max_len, alpha = 3, 0.6
    every = sum(4 ** n for n in range(1, max_len + 1))  # 4 generable tokens (unk and 3 words)
    found = beam_search(model, src, beam=every, alpha=alpha, max_len=max_len, bos=BOS, eos=EOS, pad=PAD)
    for i, hypothesis in enumerate(found):
        tokens, score = brute_force(model, src[i:i + 1, :4 - i], max_len, alpha)
        assert hypothesis.tokens == tokens
        assert hypothesis.score == pytest.approx(score, abs=1e-5)


def test_beam_of_one_is_greedy_decoding():
    torch.manual_seed(4)
    model = Transformer(9, 16, 32, 2, 1, 1, dropout=0, attention_dropout=0, activation_dropout=0).eval()
    src = torch.tensor([[4, 7, 5, EOS]])
    tokens = [BOS]
    with torch.no_grad():
        for step in range(6):
            logp = F.log_softmax(model(src, torch.tensor([tokens])), dim=-1)[0, -1]
            logp[[PAD, BOS]] = -math.inf
            if step == 0:
                logp[EOS] = -math.inf
            if step == 5:
                logp[torch.arange(9) != EOS] = -math.inf
            tokens.append(int(logp.argmax()))
            if tokens[-1] == EOS:
                break
    found = beam_search(model, src, beam=1, alpha=0.6, max_len=5, bos=BOS, eos=EOS, pad=PAD)[0]
    assert found.tokens == [t for t in tokens[1:] if t != EOS]


# -- averaged SGD and the optimizer hook --------------------------------------------------------
@pytest.mark.parametrize("history,loss,expected", [
    ([5.0, 4.0, 3.0, 2.9, 2.8], 3.5, False),        # only 5 earlier evaluations
    ([5.0, 4.0, 3.0, 2.9, 2.8, 2.7], 5.1, True),     # worse than 5.0, the best before the last 5
    ([5.0, 4.0, 3.0, 2.9, 2.8, 2.7], 4.9, False),
    ([5.0, 4.0, 3.0, 2.9, 2.8, 2.7, 2.6], 4.1, True),  # best before the last five: 4.0
])
def test_switch_to_averaged_sgd_follows_the_nonmonotone_rule(history, loss, expected):
    assert nonmonotone_trigger(history, loss, 5) == expected


def test_averaged_sgd_keeps_the_running_mean_of_the_weights_and_evaluates_with_it():
    settings = dataclasses.replace(TINY_LM, dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_drop=0)
    runtime = LanguageModelRuntime(settings, synthetic=True)
    optimizer = sgd(runtime.model)
    runtime.averaging = True
    snapshots = []
    for _step, batch in zip(range(4), runtime.batches(0)):
        runtime.train_step(batch, 0.5, optimizer)
        snapshots.append([p.detach().clone() for p in runtime.model.parameters()])
    mean = [torch.stack(ps).mean(0) for ps in zip(*snapshots)]
    trained = [p.detach().clone() for p in runtime.model.parameters()]
    averaged_eval = runtime.evaluate()
    for p, t in zip(runtime.model.parameters(), trained):
        assert torch.equal(p, t)                       # training weights are back
    with torch.no_grad():
        for p, m in zip(runtime.model.parameters(), mean):
            p.copy_(m)
    runtime.averaging = False
    assert runtime.evaluate()["loss"] == pytest.approx(averaged_eval["loss"], rel=1e-6)


def test_3a_clips_the_averaged_gradient_to_its_norm():
    settings = dataclasses.replace(TINY_LM, grad_clip=1e-3)
    runtime = LanguageModelRuntime(settings, synthetic=True)
    optimizer = sgd(runtime.model)
    before = [p.detach().clone() for p in runtime.model.parameters()]
    runtime.train_step(next(runtime.batches(0)), 1.0, optimizer)
    step = torch.cat([(p.detach() - b).view(-1) for p, b in zip(runtime.model.parameters(), before)])
    # update = -lr * (clipped gradient + weight decay * w): its norm is the clip norm (+ a tiny decay)
    assert float(step.norm()) == pytest.approx(1e-3, rel=0.02)


def test_an_optimizer_without_averaged_gradients_refuses_task_3a_in_one_line():
    runtime = LanguageModelRuntime(TINY_LM, synthetic=True)
    optimizer = sgd(runtime.model, "signsgd")
    with pytest.raises(UsageError, match=r"optimizer signsgd cannot clip the averaged gradient \(task 3a, norm 0.25\):"
                                         r" it never holds the averaged gradient; use one of centralized-adam, "
                                         r"centralized-adamw, centralized-sgd, ddp"):
        runtime.train_step(next(runtime.batches(0)), 1.0, optimizer)


def test_synthetic_4b_steps_have_the_global_token_count_and_bounded_micro_batches():
    runtime = TranslationRuntime(TINY_MT, synthetic=True)
    assert runtime.precision == "fp32" and runtime.scaler is None
    for batch in itertools.islice(runtime.batches(0), 3):
        assert len(batch.micro) == 4  # 512 / 128 micro-batches per worker with one worker
        assert batch.total_tokens == runtime.samples_in(batch)
        assert all(mb.src.numel() <= 128 and mb.tgt_out.numel() <= 128 for mb in batch.micro)


def test_centralized_adam_takes_the_tasks_adam_values_unless_the_user_set_them():
    spec = TASK4B  # Adam's values in its settings: lr_scale 1, betas (0.9, 0.98), eps 1e-9
    model = torch.nn.Linear(2, 1)

    def adam(options):
        return build_optimizer("centralized-adam", OptimizerContext(
            model=model, hyper=task_hyper(spec, 1), world_size=1, rank=0, timer=PhaseTimer(CPU, enabled=False),
            options=options))

    group = adam({}).local.param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.9, 0.98), 1e-9)
    assert adam({}).opts["lr_scale"] == 1.0
    assert adam({"beta2": "0.99"}).local.param_groups[0]["betas"] == (0.9, 0.99)


def _old_style_step(runtime: TranslationRuntime, batch, lr: float, optimizer) -> None:
    """Task 4b's step as it was written before: one autocast context per micro-batch's forward."""
    optimizer.zero_grad()
    for mb in batch.micro:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            logits = optimizer.module(mb.src, mb.tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), mb.tgt_out.reshape(-1), ignore_index=0,
                                   label_smoothing=runtime.s.label_smoothing, reduction="sum")
        (loss * (runtime.world / batch.total_tokens)).backward()
    optimizer.step(lr)


def test_4b_casts_its_weights_once_per_step_with_the_numbers_of_one_cast_per_micro_batch():
    """Mixed precision (bf16 autocast, on the CPU here as on a GPU): the runtime's one autocast
    context per step casts each weight once instead of once per micro-batch, and a step's
    gradients are those of one context per micro-batch: bit for bit, but for the embedding
    shared with the output layer, whose two gradient paths are then added in another order
    (to float32 rounding)."""
    from torch.profiler import ProfilerActivity, profile

    settings = dataclasses.replace(TINY_MT, precision="bf16", dropout=0.0, attention_dropout=0.0,
                                   activation_dropout=0.0)
    grads, casts = [], []
    for style in ("runtime", "old"):
        runtime = TranslationRuntime(settings, synthetic=True)
        assert runtime.precision == "bf16"
        opt = build_optimizer("centralized-adam", OptimizerContext(
            model=runtime.model, hyper=task_hyper(TASK4B, 1), world_size=1, rank=0,
            timer=PhaseTimer(CPU, enabled=False)))
        batch = next(runtime.batches(0))
        assert len(batch.micro) == 4
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if style == "runtime":
                runtime.train_step(batch, runtime.lr(100), opt)
            else:
                _old_style_step(runtime, batch, runtime.lr(100), opt)
        casts.append(sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy"))
        grads.append({name: p.grad.clone() for name, p in runtime.model.named_parameters()})
    ours, old = grads
    assert all(torch.equal(ours[name], old[name]) for name in ours if name != "embed.weight")
    torch.testing.assert_close(ours["embed.weight"], old["embed.weight"], rtol=1e-6, atol=1e-8)
    # the weights' casts: once per step, not once per micro-batch (4 here)
    weights = sum(1 for p in runtime.model.parameters() if p.dim() == 2)
    assert casts[1] - casts[0] >= 3 * weights, casts
