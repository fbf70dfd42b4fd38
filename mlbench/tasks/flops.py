"""How many floating-point operations one training step of a model costs: the numerator of the
achieved FLOP/s and of the utilisation that `status RUN` shows (docs/system-metrics.md).

Two ways, and each run records which one it used:

- ``analytic`` for task 2a's logistic regression: a step of a batch of ``B`` samples with ``D``
  features is the score ``X w`` (``2 B D``) and the gradient ``X^T s`` (``2 B D``): ``4 B D``.
  The backward pass needs no gradient of the input, so the usual "backward = 2 x forward" rule
  would count ``6 B D``, one matrix-vector product too many.
- ``analytic x3`` for task 3a's AWD-LSTM and task 4b's Transformer: the forward pass's matrix
  products counted from the shapes (:func:`lstm_language_model_flops`,
  :func:`transformer_flops`), the step 3 x that (below). Not the flop counter: on the CPU it
  sees neither the LSTM kernel nor the fused attention, and on a GPU neither cuDNN's LSTM; a
  test checks the formulas against it with those kernels switched to their decomposed forms.
- ``flop-counter x3``: torch's ``FlopCounterMode`` counts the matrix products and convolutions
  of one forward pass, and the step is 3 x that (the backward pass computes the gradients of
  the inputs and of the weights, each as costly as the forward: Kaplan et al. 2020,
  arXiv:2001.08361, section 2.1; the convention of PaLM's model-FLOP utilisation).

Both count multiply-adds as 2 and leave out element-wise work (activations, normalisation, the
optimizer's update), as the MFU convention does.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch

ANALYTIC = "analytic"
ANALYTIC_X3 = "analytic x3"
FLOP_COUNTER = "flop-counter x3"


def logistic_regression_flops(batch: int, features: int) -> int:
    """FLOPs of one step of the logistic regression: ``4 B D`` (see the module)."""
    return 4 * batch * features


def lstm_language_model_flops(tokens: int, sizes: list[int], vocab: int) -> int:
    """Forward FLOPs of a stack of LSTMs and a linear output over ``tokens`` (time steps x
    sequences): per token and layer of input ``i`` and hidden ``h`` the gates' products
    ``W_ih x`` and ``W_hh h`` (``2 * 4h * (i + h)``), then the output ``2 E V`` (``E`` the last
    layer's size). ``sizes`` is the embedding's size then each layer's hidden size; the
    embedding's look-up and the biases are not products."""
    recurrent = sum(2 * 4 * h * (i + h) for i, h in itertools.pairwise(sizes))
    return tokens * (recurrent + 2 * sizes[-1] * vocab)


def transformer_flops(sentences: int, source: int, target: int, *, dim: int, ffn: int, encoder_layers: int,
                      decoder_layers: int, vocab: int) -> int:
    """Forward FLOPs of the encoder-decoder Transformer on a padded batch of ``sentences``
    sources of ``source`` tokens and target prefixes of ``target`` tokens (the shapes the device
    computes, padding included). Per sentence, with ``d`` the model size and ``f`` the
    feed-forward size: an encoder layer's four projections ``8 S d^2``, its attention scores and
    weighted values ``4 S^2 d`` and feed-forward ``4 S d f``; a decoder layer's self-attention
    ``8 T d^2 + 4 T^2 d`` (the causal mask still computes every score), cross-attention
    (queries and output on the target, keys and values on the source) ``4 T d^2 + 4 S d^2 +
    4 T S d`` and feed-forward ``4 T d f``; the output projection ``2 T d V``."""
    s, t, d = source, target, dim
    encoder = 8 * s * d * d + 4 * s * s * d + 4 * s * d * ffn
    decoder = (8 * t * d * d + 4 * t * t * d) + (4 * t * d * d + 4 * s * d * d + 4 * t * s * d) + 4 * t * d * ffn
    return sentences * (encoder_layers * encoder + decoder_layers * decoder + 2 * t * d * vocab)


def load_flop_counter() -> None:
    """Import torch's flop counter (:func:`counted_flops`) now, before anything imports TensorFlow.

    The counter loads triton's LLVM, which crashes the process (SIGSEGV, no Python error) when
    TensorFlow's LLVM was loaded first (TensorFlow 2.21, torch 2.14; the other order is fine). So
    every path that may bring TensorFlow into a process that may count FLOPs calls this first: a
    TensorFlow worker. (The TensorBoard exporter, which a PyTorch worker also runs with ``run
    --log-to``, keeps TensorFlow out of its process instead: :mod:`mlbench.results.exporters`.)"""
    import torch.utils.flop_counter  # noqa: F401


def preload_flop_counter() -> None:
    """Import all that :func:`counted_flops` imports on its first use: torch's flop counter and
    ``torch._dynamo``, which the counter's dispatch mode loads on its first operation (about 1.3
    CPU-seconds on a 2-core box, as much as a short run's steps). A supervisor that forks its
    ranks calls it once before the fork (``prepare_before_fork`` of the classification runtime),
    so that the ranks share the modules instead of each importing them; it starts no thread."""
    load_flop_counter()
    import torch._dynamo  # noqa: F401


@torch.no_grad()
def counted_flops(model: torch.nn.Module, sample: torch.Tensor, batch: int) -> int:
    """3 x the FLOPs of ``model``'s forward pass on ``sample`` (a batch of one), times ``batch``.

    A batch of one, because every model of the classification tasks costs the same per sample
    (no layer mixes samples in a product) and its test set may hold fewer samples than a
    batch; in evaluation mode, so that batch-norm statistics and dropout stay untouched (the
    products are the same in both modes).
    """
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        counter = FlopCounterMode(display=False)
        with _dynamo_not_loaded_for_the_count(), counter:
            model(sample)
    finally:
        model.train(was_training)
    return 3 * int(counter.get_total_flops()) * batch


#: what torch's ``_disable_dynamo`` caches on the function it wraps (torch/_compile.py)
_DYNAMO_DISABLED = "__dynamo_disable"


@contextlib.contextmanager
def _dynamo_not_loaded_for_the_count() -> Iterator[None]:
    """Count without importing ``torch._dynamo``, where nothing has imported it yet.

    The flop counter's dispatch (``_FlopCounterMode.__torch_dispatch__``) is wrapped in torch's
    ``_disable_dynamo``, which on its first call imports ``torch._dynamo`` (and sympy with it:
    1.37 CPU-seconds of a worker's start, more than the rest of the count) only to keep dynamo
    from tracing into it. While dynamo is not loaded nothing can be tracing, so for the count the
    wrapper is told the function is its own disabled form, and forgets that afterwards, so that
    a later use in a process that compiles is wrapped as torch means it to be. Where torch's
    layout differs (another version) or dynamo is loaded already, nothing is changed."""
    import sys

    from torch.utils import flop_counter

    dispatch = getattr(getattr(flop_counter, "_FlopCounterMode", None), "__torch_dispatch__", None)
    original = getattr(dispatch, "__wrapped__", None)
    if original is None or "torch._dynamo" in sys.modules or hasattr(original, _DYNAMO_DISABLED):
        yield
        return
    setattr(original, _DYNAMO_DISABLED, original)
    try:
        yield
    finally:
        delattr(original, _DYNAMO_DISABLED)
