"""The Transformer of task 4b: encoder-decoder, "big" size, pre-norm, shared embeddings.

Vaswani et al. 2017, "Attention Is All You Need" (NeurIPS, arXiv:1706.03762), Table 3 "big":
6 encoder and 6 decoder layers, model size 1024, feed-forward 4096, 16 heads; dropout 0.1 on
every sub-layer output, on the attention weights and after the feed-forward activation. As in
fairseq's ``transformer_wmt_en_de_big`` with ``--share-all-embeddings`` and
``--encoder/decoder-normalize-before`` (the original MLBench reference is a fairseq fork):

* **pre-norm** (Wang et al. 2019, "Learning Deep Transformer Models for Machine Translation"):
  each sub-layer is ``x + dropout(f(LayerNorm(x)))``; a final LayerNorm closes each stack;
* **one embedding matrix** for source tokens, target tokens and the output projection (a joint
  BPE vocabulary), scaled by sqrt(d) on input, normal(0, d^-1/2) initialised, padding row 0;
* **sinusoidal positions** as fairseq computes them (sin and cos halves concatenated, positions
  counted from padding_idx + 1);
* attention projections q, k, v, out with biases, xavier-uniform weights, zero biases; the
  attention itself is ``F.scaled_dot_product_attention``, with cuDNN's kernel left out (see
  :data:`ATTENTION_KERNELS`).

Parameter count for a vocabulary of V (d model size, f feed-forward size, L layers per stack):
``V*d + L*(4(d^2+d) + 2df + f + d + 4d) + L*(8(d^2+d) + 2df + f + d + 6d) + 4d``, i.e.
209,915,904 for V = 32,768 (the mlbench default BPE vocabulary): the "about 210 M" of SPEC.

The decoder can run one position at a time with cached keys and values (:meth:`decode_step`),
which beam search uses; a test checks that it equals the full teacher-forced pass.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

#: Per-layer cache of incremental decoding: self-attention keys/values so far, cross keys/values.
LayerCache = dict[str, torch.Tensor]

#: The kernels ``scaled_dot_product_attention`` may choose from here: torch's own order without
#: cuDNN's. On Hopper GPUs torch prefers cuDNN's kernel, which builds an execution graph on the
#: host for every new shape; the micro-batches of token buckets all differ in shape, so on an
#: H200 the host spent 5.8 of a 7.0 s step building graphs (10 ms per call), the GPU busy 12% of
#: the time. The memory-efficient kernel (masks and dropout) and flash (causal, no mask) have no
#: such cost and were as fast per call (docs/performance.md, task 4b on one GPU). On the CPU the
#: choice is torch's default (flash, then math).
ATTENTION_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_ENABLED = {SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled,
            SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled,
            SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled,
            SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.cudnn_sdp_enabled}


def attention_kernels() -> contextlib.AbstractContextManager:
    """The context the model's attention runs in: :data:`ATTENTION_KERNELS`, less those the
    caller has switched off (a caller's own ``sdpa_kernel``, math only say, stands)."""
    allowed = [kernel for kernel in ATTENTION_KERNELS if _ENABLED[kernel]()]
    return sdpa_kernel(allowed) if allowed else contextlib.nullcontext()


def sinusoidal_table(positions: int, dim: int, padding_idx: int) -> torch.Tensor:
    """fairseq's SinusoidalPositionalEmbedding table [positions + padding_idx + 1, dim]."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    angles = torch.arange(positions + padding_idx + 1, dtype=torch.float)[:, None] * freqs[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(table.size(0), 1)], dim=1)
    table[padding_idx] = 0
    return table


class Attention(nn.Module):
    """Multi-head attention with bias-carrying projections (4(d^2 + d) parameters)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"model size {dim} is not a multiple of the {heads} heads")
        self.heads, self.dropout = heads, dropout
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, query: torch.Tensor, memory: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, causal: bool = False,
                cache: LayerCache | None = None, prefix: str = "") -> torch.Tensor:
        """Self-attention (``memory`` None) or attention over ``memory``; ``mask`` is a bool
        [B, 1, 1, S] of the keys that may be attended to. With ``cache`` (incremental
        decoding): self-attention appends this step's keys/values, cross-attention computes
        the memory's keys/values once."""
        q = self._split(self.q(query))
        if memory is None:
            k, v = self._split(self.k(query)), self._split(self.v(query))
            if cache is not None:
                if prefix + "k" in cache:
                    k = torch.cat([cache[prefix + "k"], k], dim=2)
                    v = torch.cat([cache[prefix + "v"], v], dim=2)
                cache[prefix + "k"], cache[prefix + "v"] = k, v
        elif cache is not None and prefix + "k" in cache:
            k, v = cache[prefix + "k"], cache[prefix + "v"]
        else:
            k, v = self._split(self.k(memory)), self._split(self.v(memory))
            if cache is not None:
                cache[prefix + "k"], cache[prefix + "v"] = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        b, h, t, dh = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, h * dh))


class FeedForward(nn.Module):
    def __init__(self, dim: int, ffn: int, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.activation_dropout = activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(F.relu(self.fc1(x)), self.activation_dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int, dropout: float, attention_dropout: float,
                 activation_dropout: float):
        super().__init__()
        self.attn_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, attention_dropout)
        self.ffn = FeedForward(dim, ffn, activation_dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(self.attn(self.attn_norm(x), mask=mask), self.dropout, self.training)
        return x + F.dropout(self.ffn(self.ffn_norm(x)), self.dropout, self.training)


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int, dropout: float, attention_dropout: float,
                 activation_dropout: float):
        super().__init__()
        self.self_norm, self.cross_norm, self.ffn_norm = (nn.LayerNorm(dim) for _ in range(3))
        self.self_attn = Attention(dim, heads, attention_dropout)
        self.cross_attn = Attention(dim, heads, attention_dropout)
        self.ffn = FeedForward(dim, ffn, activation_dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        drop = lambda y: F.dropout(y, self.dropout, self.training)
        # A full target sequence is masked causally; one incremental step sees all it cached.
        x = x + drop(self.self_attn(self.self_norm(x), causal=cache is None, cache=cache, prefix="self_"))
        x = x + drop(self.cross_attn(self.cross_norm(x), memory, mask=memory_mask, cache=cache, prefix="cross_"))
        return x + drop(self.ffn(self.ffn_norm(x)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer over one shared vocabulary; batch-first token ids."""

    def __init__(self, vocab_size: int, dim: int = 1024, ffn: int = 4096, heads: int = 16,
                 encoder_layers: int = 6, decoder_layers: int = 6, dropout: float = 0.1,
                 attention_dropout: float = 0.1, activation_dropout: float = 0.1, pad_id: int = 0,
                 max_positions: int = 1024):
        super().__init__()
        self.vocab_size, self.dim, self.pad_id, self.max_positions = vocab_size, dim, pad_id, max_positions
        self.dropout = dropout
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        # A constant, not a buffer: DDP would broadcast a buffer before every forward pass.
        self._positions: dict[torch.device, torch.Tensor] = {}
        args = (dim, ffn, heads, dropout, attention_dropout, activation_dropout)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args) for _ in range(decoder_layers))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.dim ** -0.5)
        with torch.no_grad():
            self.embed.weight[self.pad_id].zero_()

    def _embed(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        t = tokens.size(1)
        if start + t > self.max_positions:
            raise ValueError(f"sequence of {start + t} tokens is longer than the model's {self.max_positions}")
        device = self.embed.weight.device
        if device not in self._positions:
            self._positions[device] = sinusoidal_table(self.max_positions, self.dim, self.pad_id).to(device)
        positions = self._positions[device][self.pad_id + 1 + start: self.pad_id + 1 + start + t]
        x = self.embed(tokens) * math.sqrt(self.dim) + positions.to(self.embed.weight.dtype)
        return F.dropout(x, self.dropout, self.training)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(encoder output [B, S, d], key mask [B, 1, 1, S], True where a source token is real)."""
        mask = (src != self.pad_id)[:, None, None, :]
        x = self._embed(src)
        with attention_kernels():
            for layer in self.encoder:
                x = layer(x, mask)
        return self.encoder_norm(x), mask

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.decoder_norm(x), self.embed.weight)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoder: logits [B, T, V] for the target prefix ``tgt_in`` [B, T]."""
        x = self._embed(tgt_in)
        with attention_kernels():
            for layer in self.decoder:
                x = layer(x, memory, memory_mask)
        return self.logits(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)

    def new_cache(self) -> list[LayerCache]:
        return [{} for _ in self.decoder]

    def decode_step(self, token: torch.Tensor, step: int, memory: torch.Tensor, memory_mask: torch.Tensor,
                    cache: list[LayerCache]) -> torch.Tensor:
        """Logits [B, V] for position ``step`` given its input token [B, 1] and the cache of the
        positions before (updated in place)."""
        x = self._embed(token, start=step)
        with attention_kernels():
            for layer, layer_cache in zip(self.decoder, cache):
                x = layer(x, memory, memory_mask, cache=layer_cache)
        return self.logits(x)[:, -1]


def reorder_cache(cache: list[LayerCache], index: torch.Tensor) -> list[LayerCache]:
    """The cache of the hypotheses ``index`` selects (beam search keeps or drops rows)."""
    return [{key: value.index_select(0, index) for key, value in layer.items()} for layer in cache]
