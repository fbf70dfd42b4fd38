"""GPT-2 small, as OpenAI released it and llm.c and nanoGPT reproduce it (Radford et al. 2019).

Decoder-only Transformer: learned token and position embeddings, ``layers`` pre-LayerNorm blocks
of causal self-attention and a GELU (tanh approximation) MLP of width ``4 x width``, a final
LayerNorm, and the output layer tied to the token embedding. Linear layers and LayerNorms carry
biases, as GPT-2's do, and nothing drops out. The vocabulary of 50,257 tokens is padded to
50,304 rows (a multiple of 128, as nanoGPT and llm.c pad it): the padded rows are never targets.
Initialisation is GPT-2's: every weight Normal(0, 0.02), the residual projections' weights
Normal(0, 0.02 / sqrt(2 x layers)), biases 0, LayerNorms 1 and 0.
The parameter names are nanoGPT's, so that GPT-2's released weights map onto them one to one
(Hugging Face's Conv1D weights transposed).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: What the FLOP count of a step says it counts (see :func:`flops_per_token`).
FLOPS_PER_TOKEN = "6N + 12LHQT per token"


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, time, width))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 of ``layers`` blocks, ``heads`` heads, ``width`` channels and ``context`` positions,
    over ``vocab`` embedding rows (the padded vocabulary)."""

    def __init__(self, *, layers: int, heads: int, width: int, context: int, vocab: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.layers, self.heads, self.width, self.context, self.vocab = layers, heads, width, context, vocab
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one tensor, one gradient
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation (see the module)."""
        residual_std = 0.02 / math.sqrt(2 * self.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith("c_proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [batch, time, vocab] of token ids ``idx`` [batch, time]."""
        time = idx.size(1)
        if time > self.context:
            raise ValueError(f"a sequence of {time} tokens is longer than the context of {self.context}")
        positions = torch.arange(time, device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def decayed(name: str, param: torch.Tensor) -> bool:
    """Whether AdamW's weight decay applies: to the matrices (linear weights and embeddings, as
    llm.c and nanoGPT decay every parameter of two or more dimensions), not to biases or LayerNorms."""
    return param.dim() >= 2


def parameter_count(model: GPT, *, positions: bool = True) -> int:
    """The parameters, each tensor once (the tied output layer is the token embedding);
    ``positions=False`` leaves the position embedding out, as the FLOP count does."""
    total = sum(p.numel() for p in model.parameters())
    return total if positions else total - model.wpe.weight.numel()


def flops_per_token(model: GPT, context: int) -> int:
    """Training FLOPs per token: ``6 N + 12 L H Q T`` (PaLM, Chowdhery et al. 2022, appendix B;
    nanoGPT's ``estimate_mfu``): N the parameters but the position embedding (the tied output
    layer counts once, as its matrix product), and the attention's scores and weighted sum
    (``2 x 2 x T x width`` per token and layer forward, x3 for the step) for sequences of T."""
    return 6 * parameter_count(model, positions=False) + 12 * model.layers * model.width * context
