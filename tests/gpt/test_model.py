"""Task 5a's GPT-2 against Hugging Face's GPT2LMHeadModel from the same weights (logits, and one
AdamW step), its parameter count and FLOPs per token by hand, and llm.c's schedule at every step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mlbench.tasks.task5a.model import GPT, decayed, flops_per_token, parameter_count
from mlbench.tasks.task5a.settings import GPTSettings

transformers = pytest.importorskip("transformers")

SMALL = {"layers": 2, "heads": 4, "width": 64, "context": 32, "vocab": 384}


def hf_model(model: GPT) -> torch.nn.Module:
    """Hugging Face's GPT-2 of the same shape, holding ``model``'s weights (Conv1D: transposed)."""
    config = transformers.GPT2Config(vocab_size=model.vocab, n_positions=model.context, n_embd=model.width,
                                     n_layer=model.layers, n_head=model.heads, activation_function="gelu_new",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    reference = transformers.GPT2LMHeadModel(config).double()
    ours = model.state_dict()
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    theirs = {}
    for name, value in ours.items():
        if name == "lm_head.weight":
            continue
        theirs["transformer." + name] = value.t() if name.endswith(transposed) else value
    missing, unexpected = reference.load_state_dict(theirs, strict=False)
    assert not unexpected and all(".attn.bias" in m or ".attn.masked_bias" in m or m == "lm_head.weight"
                                  for m in missing), (missing, unexpected)
    reference.tie_weights()
    return reference.eval()


def test_gpt2_small_has_its_124m_parameters_and_the_speedruns_flops_per_token():
    model = GPT(layers=12, heads=12, width=768, context=1024, vocab=50_304)
    # by hand: embeddings V*C + T*C; per block 2 LayerNorms 4C, attention 4C^2 + 4C, MLP 8C^2 + 5C; final 2C
    c, v, t, layers = 768, 50_304, 1024, 12
    by_hand = v * c + t * c + layers * (12 * c * c + 13 * c) + 2 * c
    assert parameter_count(model) == by_hand == 124_475_904
    assert flops_per_token(model, 1024) == 6 * (by_hand - t * c) + 12 * layers * c * t


def test_the_model_equals_hugging_faces_gpt2_from_the_same_weights():
    torch.manual_seed(0)
    model = GPT(**SMALL).double()
    reference = hf_model(model)
    tokens = torch.randint(0, SMALL["vocab"], (3, SMALL["context"]))
    ours, theirs = model(tokens), reference(tokens).logits
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-10), (ours - theirs).abs().max()


def test_the_initialisation_is_gpt2s():
    torch.manual_seed(0)
    model = GPT(layers=4, heads=4, width=256, context=64, vocab=4096)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05), name
        elif p.dim() == 2:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith(".bias") and not name.startswith("ln"):
            assert "ln_" in name or torch.count_nonzero(p) == 0, name
    assert model.lm_head.weight is model.wte.weight


def test_one_adamw_step_with_decay_on_the_matrices_equals_hugging_faces_model_stepped_the_same():
    torch.manual_seed(1)
    model = GPT(**SMALL).double()
    reference = hf_model(model).train()
    tokens = torch.randint(0, SMALL["vocab"], (2, SMALL["context"] + 1))

    def step(module, logits_of):
        decay = [p for n, p in module.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in module.named_parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                      lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
        logits = logits_of(module, tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    ours = step(model, lambda m, x: m(x))
    theirs = step(reference, lambda m, x: m(x).logits)
    assert ours == pytest.approx(theirs, abs=1e-12)
    after = reference.state_dict()
    for name, p in model.named_parameters():
        if name == "lm_head.weight":
            continue
        other = after["transformer." + name]
        other = other.t() if p.dim() == 2 and name.split(".")[-2] in ("c_attn", "c_proj", "c_fc") else other
        assert torch.allclose(p, other, rtol=0, atol=1e-10), name
    assert [decayed(n, p) for n, p in model.named_parameters()].count(True) == 2 + 4 * SMALL["layers"]


def test_the_schedule_is_llm_cs_formula_at_every_step():
    s = GPTSettings()
    for step in range(s.steps + 5):
        if step < 700:
            expected = 6e-4 * (step + 1) / 700
        elif step >= 19_073:
            expected = 0.0
        else:
            expected = 0.5 * 6e-4 * (1 + math.cos(math.pi * (step - 700) / (19_073 - 700)))
        assert s.learning_rate(step) == pytest.approx(expected, rel=1e-12, abs=1e-18), step
    assert s.max_epochs == math.ceil(19_073 / 250) == 77
    assert s.tokens_per_step == 524_288 and s.accumulation(8) == 1 and s.accumulation(1) == 8


def test_a_global_batch_that_is_not_whole_micro_batches_is_refused_in_words():
    s = GPTSettings(global_batch=512, batch_per_worker=64)
    assert s.check(8) is None and s.check(3) is not None
    assert "a global batch of 512 sequences is not a whole number of micro-batches of 64" in s.check(3)
