"""AWD-LSTM, the language model of task 3a.

Merity, Keskar & Socher 2018, "Regularizing and Optimizing LSTM Language Models" (ICLR,
arXiv:1708.02182), with the Wikitext-2 settings of its reference code (salesforce/awd-lstm-lm):

* an embedding of size 400 whose weight is tied to the output layer (Inan et al. 2017; Press &
  Wolf 2017), three single-layer LSTMs of hidden size 1150, 1150 and 400 (the last one has the
  embedding size so that the output can use the tied weight), a linear output with a bias;
* **weight drop** 0.5: DropConnect (Wan et al. 2013) on each LSTM's hidden-to-hidden matrix,
  one mask per forward pass, so the recurrence itself keeps the fast cuDNN kernel;
* **embedding dropout** 0.1: whole rows of the embedding (word types) are dropped;
* **locked (variational) dropout** (Gal & Ghahramani 2016): one mask per sequence, shared by all
  time steps: 0.65 on the embedding output, 0.2 between LSTM layers, 0.4 on the last output.

Initialisation as the reference: embedding uniform in [-0.1, 0.1], output bias 0, the LSTMs
keep PyTorch's default (uniform in +-1/sqrt(hidden)).

With a vocabulary of V words the model has V*400 + V parameters in the embedding and the output
bias, plus 4h(i + h) + 8h per LSTM of input size i and hidden size h: 33,556,078 for
Wikitext-2's 33,278 words.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

Hidden = list[tuple[torch.Tensor, torch.Tensor]]


class WeightDropLSTM(nn.LSTM):
    """A one-layer ``nn.LSTM`` whose hidden-to-hidden weight is dropped out (DropConnect).

    The trained parameter is ``weight_hh_l0_raw``; before each forward pass the weight the LSTM
    kernel reads, ``weight_hh_l0``, is set to a dropped-out copy of it (training) or to it
    (evaluation). ``nn.LSTM`` notices the new tensor and rebuilds its list of flat weights
    itself (``RNNBase._update_flat_weights``; on CUDA that also re-packs them into one cuDNN
    buffer), which is why this works on current PyTorch without patching
    ``flatten_parameters`` as the 2017 reference code did.
    """

    def __init__(self, input_size: int, hidden_size: int, weight_drop: float):
        super().__init__(input_size, hidden_size)
        raw = self._parameters.pop("weight_hh_l0")
        assert raw is not None  # nn.LSTM made it
        self.weight_hh_l0_raw: nn.Parameter = raw
        self.weight_drop = weight_drop
        self._use_hh(raw.detach())

    def _use_hh(self, weight: torch.Tensor) -> None:
        # A plain attribute (not a Parameter): RNNBase.__setattr__ keeps _flat_weights current.
        self.weight_hh_l0 = weight

    def forward(self, input: torch.Tensor,  # type: ignore[override]  # Tensors only, no PackedSequence
                hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        raw = self.weight_hh_l0_raw
        if self.training and self.weight_drop > 0:
            self._use_hh(F.dropout(raw, self.weight_drop, training=True))
        else:
            self._use_hh(raw.view_as(raw))  # a view, not the Parameter itself: gradients still flow
        try:
            return super().forward(input, hx)
        finally:
            # Keep no reference to this pass's graph (and stay deep-copyable).
            self._use_hh(raw.detach())


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout on [T, B, H]: one mask per sequence and feature, shared over time."""
    if not training or p == 0:
        return x
    mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(embed: nn.Embedding, tokens: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Look up ``tokens`` with whole rows (word types) of the embedding dropped with rate ``p``."""
    weight = embed.weight
    if training and p > 0:
        mask = weight.new_empty(weight.size(0), 1).bernoulli_(1 - p) / (1 - p)
        weight = weight * mask
    return F.embedding(tokens, weight)


class AWDLSTM(nn.Module):
    """AWD-LSTM language model; inputs are token ids [T, B] (time-major, as the reference)."""

    def __init__(self, vocab_size: int, embedding: int = 400, hidden: int = 1150, layers: int = 3,
                 dropout: float = 0.4, dropout_h: float = 0.2, dropout_i: float = 0.65,
                 dropout_e: float = 0.1, weight_drop: float = 0.5):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be at least 1, not {layers}")
        self.vocab_size = vocab_size
        self.dropout, self.dropout_h, self.dropout_i, self.dropout_e = dropout, dropout_h, dropout_i, dropout_e
        self.encoder = nn.Embedding(vocab_size, embedding)
        sizes = [embedding] + [hidden] * (layers - 1) + [embedding]
        self.rnns = nn.ModuleList(WeightDropLSTM(sizes[i], sizes[i + 1], weight_drop) for i in range(layers))
        self.decoder = nn.Linear(embedding, vocab_size)
        self.decoder.weight = self.encoder.weight  # tied input and output embeddings
        with torch.no_grad():
            self.encoder.weight.uniform_(-0.1, 0.1)
            self.decoder.bias.zero_()

    def init_hidden(self, batch: int) -> Hidden:
        """Zero (h, c) for every layer, [1, batch, size] each."""
        weight = self.encoder.weight
        sizes = [cast(WeightDropLSTM, rnn).hidden_size for rnn in self.rnns]
        return [(weight.new_zeros(1, batch, size), weight.new_zeros(1, batch, size)) for size in sizes]

    def forward(self, tokens: torch.Tensor, hidden: Hidden
                ) -> tuple[torch.Tensor, Hidden, torch.Tensor, torch.Tensor]:
        """(logits [T*B, V], new hidden, last layer's raw output [T, B, E], the same after its
        dropout); the last two are what activation regularisation (AR) and temporal activation
        regularisation (TAR) of Merity et al. act on."""
        x = embedding_dropout(self.encoder, tokens, self.dropout_e, self.training)
        x = locked_dropout(x, self.dropout_i, self.training)
        new_hidden: Hidden = []
        raw = x
        for layer, (rnn, state) in enumerate(zip(self.rnns, hidden)):
            raw, state = rnn(x, state)
            new_hidden.append(state)
            x = raw if layer == len(self.rnns) - 1 else locked_dropout(raw, self.dropout_h, self.training)
        dropped = locked_dropout(raw, self.dropout, self.training)
        logits = self.decoder(dropped.reshape(-1, dropped.size(2)))
        return logits, new_hidden, raw, dropped


def detach_hidden(hidden: Hidden) -> Hidden:
    """The state carried to the next batch, cut from the graph of the batch before (truncated
    back-propagation through time)."""
    return [(h.detach(), c.detach()) for h, c in hidden]
