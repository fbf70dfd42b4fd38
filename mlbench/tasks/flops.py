"""How many floating-point operations one training step of a model costs: the numerator of the
achieved FLOP/s and of the utilisation that `status RUN` shows (docs/system-metrics.md).

Two ways, and each run records which one it used:

- ``analytic`` for task 2a's logistic regression: a step of a batch of ``B`` samples with ``D``
  features is the score ``X w`` (``2 B D``) and the gradient ``X^T s`` (``2 B D``): ``4 B D``.
  The backward pass needs no gradient of the input, so the usual "backward = 2 x forward" rule
  would count ``6 B D``, one matrix-vector product too many.
- ``flop-counter x3``: torch's ``FlopCounterMode`` counts the matrix products and convolutions
  of one forward pass, and the step is 3 x that (the backward pass computes the gradients of
  the inputs and of the weights, each as costly as the forward: Kaplan et al. 2020,
  arXiv:2001.08361, section 2.1; the convention of PaLM's model-FLOP utilisation).

Both count multiply-adds as 2 and leave out element-wise work (activations, normalisation, the
optimizer's update), as the MFU convention does.
"""

from __future__ import annotations

import torch

ANALYTIC = "analytic"
FLOP_COUNTER = "flop-counter x3"


def logistic_regression_flops(batch: int, features: int) -> int:
    """FLOPs of one step of the logistic regression: ``4 B D`` (see the module)."""
    return 4 * batch * features


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
        with counter:
            model(sample)
    finally:
        model.train(was_training)
    return 3 * int(counter.get_total_flops()) * batch
