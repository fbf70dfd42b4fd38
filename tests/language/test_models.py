"""The models of tasks 3a and 4b: parameter counts derived by hand, and their mechanics."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from mlbench.tasks.task3a.model import AWDLSTM
from mlbench.tasks.task4b.model import Transformer, sinusoidal_table


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def awd_lstm_count(vocab: int, emb: int, hidden: int, layers: int) -> int:
    """Tied embedding V*E + output bias V + per LSTM (input i, hidden h): 4h*i + 4h*h + 8h."""
    sizes = [emb] + [hidden] * (layers - 1) + [emb]
    lstms = sum(4 * h * i + 4 * h * h + 8 * h for i, h in itertools.pairwise(sizes))
    return vocab * emb + vocab + lstms


def transformer_count(vocab: int, d: int, f: int, enc: int, dec: int) -> int:
    """Shared embedding V*d; an attention 4(d^2 + d); a feed-forward 2df + f + d; a LayerNorm 2d;
    encoder layer = attention + FFN + 2 LN, decoder layer = 2 attentions + FFN + 3 LN; a final LN per stack."""
    attention, ffn, norm = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
    return vocab * d + enc * (attention + ffn + 2 * norm) + dec * (2 * attention + ffn + 3 * norm) + 2 * norm


def test_awd_lstm_full_size_on_wikitext2_vocabulary_has_the_hand_derived_count():
    with torch.device("meta"):
        model = AWDLSTM(33_278)
    assert count(model) == awd_lstm_count(33_278, 400, 1150, 3) == 33_556_078


def test_transformer_big_on_a_32k_bpe_vocabulary_has_the_hand_derived_count():
    with torch.device("meta"):
        model = Transformer(32_768)
    assert count(model) == transformer_count(32_768, 1024, 4096, 6, 6) == 209_915_904


@pytest.mark.parametrize("vocab,emb,hidden,layers", [(50, 8, 12, 3), (77, 6, 10, 2), (30, 4, 4, 1)])
def test_small_awd_lstms_have_the_hand_derived_count(vocab, emb, hidden, layers):
    assert count(AWDLSTM(vocab, emb, hidden, layers)) == awd_lstm_count(vocab, emb, hidden, layers)


def test_small_transformer_has_the_hand_derived_count():
    assert count(Transformer(61, 16, 40, 4, 2, 3)) == transformer_count(61, 16, 40, 2, 3)


def test_awd_lstm_ties_input_and_output_embeddings():
    model = AWDLSTM(40, 8, 12, 3)
    assert model.decoder.weight is model.encoder.weight


def test_weight_drop_masks_the_hidden_to_hidden_weight_in_training_only():
    torch.manual_seed(0)
    model = AWDLSTM(40, 8, 12, 3, dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_drop=0.5)
    tokens = torch.randint(0, 40, (6, 3))
    model.eval()
    a = model(tokens, model.init_hidden(3))[0]
    assert torch.equal(a, model(tokens, model.init_hidden(3))[0])  # deterministic without drop
    model.train()
    b = model(tokens, model.init_hidden(3))[0]
    assert not torch.allclose(a, b)  # only weight drop is on: it changed the output
    b.sum().backward()
    raw = model.rnns[0].weight_hh_l0_raw
    assert raw.grad is not None
    zero_rows = (raw.grad == 0).float().mean()
    assert 0.2 < zero_rows < 0.8  # about half the entries were dropped, so got no gradient
    copy.deepcopy(model)  # no graph is kept inside the module


def test_awd_lstm_without_dropout_is_a_plain_lstm_stack():
    torch.manual_seed(0)
    model = AWDLSTM(30, 6, 10, 2, dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_drop=0).train()
    tokens = torch.randint(0, 30, (5, 2))
    x = model.encoder(tokens)
    for rnn in model.rnns:
        lstm = torch.nn.LSTM(rnn.input_size, rnn.hidden_size)
        lstm.load_state_dict({"weight_ih_l0": rnn.weight_ih_l0, "weight_hh_l0": rnn.weight_hh_l0_raw,
                              "bias_ih_l0": rnn.bias_ih_l0, "bias_hh_l0": rnn.bias_hh_l0})
        x = lstm(x)[0]
    expected = F.linear(x.reshape(-1, 6), model.encoder.weight, model.decoder.bias)
    torch.testing.assert_close(model(tokens, model.init_hidden(2))[0], expected)


def test_incremental_decoding_equals_the_teacher_forced_decoder():
    torch.manual_seed(0)
    model = Transformer(40, 16, 32, 4, 2, 2).eval()
    src = torch.randint(4, 40, (3, 7))
    src[0, 5:] = 0  # padding
    tgt = torch.randint(4, 40, (3, 6))
    full = model(src, tgt)
    memory, mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode_step(tgt[:, t:t + 1], t, memory, mask, cache) for t in range(6)]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_source_padding_does_not_change_the_translation_scores():
    torch.manual_seed(0)
    model = Transformer(40, 16, 32, 4, 2, 2).eval()
    src = torch.randint(4, 40, (1, 5))
    tgt = torch.randint(4, 40, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_are_fairseqs_table():
    table = sinusoidal_table(10, 8, padding_idx=0)
    assert torch.equal(table[0], torch.zeros(8))
    pos = 3  # the third real position is row padding_idx + 3
    freqs = torch.exp(torch.arange(4, dtype=torch.float) * -(torch.log(torch.tensor(10000.0)) / 3))
    torch.testing.assert_close(table[pos], torch.cat([torch.sin(pos * freqs), torch.cos(pos * freqs)]))
