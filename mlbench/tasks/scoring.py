"""One evaluation for every framework: the test loss and the goal metric from a worker's outputs.

A worker of any framework (PyTorch, JAX; docs/worker-contract.md) computes the outputs of its
share of the test set and hands them over as NumPy arrays; the numbers that decide the goal are
computed here, in float64 NumPy, never by the framework under test. So the same outputs are
scored the same way whichever framework produced them, and a port cannot reach a goal by
scoring itself more kindly (another tie rule, a loss summed in float16).

:func:`score_outputs` returns sums (loss, number right, count) that the workers add up over their
shards (one all-reduce, in whatever the framework offers); :func:`metrics_of` turns the sums
into the ``eval/loss`` and ``eval/accuracy`` the trainer records.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The sums :func:`score_outputs` returns, in this order.
TOTALS = ("loss_sum", "correct", "count")


def _logistic(outputs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """log(1 + exp(-y z)) for labels y in {-1, +1}; a logit of 0 predicts +1 (as z >= 0)."""
    z = outputs.astype(np.float64).reshape(-1)
    y = labels.astype(np.float64).reshape(-1)
    loss = np.logaddexp(0.0, -y * z).sum()
    predicted = np.where(z >= 0, 1.0, -1.0)
    return float(loss), float((predicted == y).sum())


def _cross_entropy(outputs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """-log softmax(z)[y]; the prediction is the first class of the largest logit."""
    z = outputs.astype(np.float64)
    y = labels.astype(np.int64).reshape(-1)
    top = z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
    loss = (log_norm - z[np.arange(z.shape[0]), y]).sum()
    return float(loss), float((z.argmax(axis=1) == y).sum())


_SCORERS = {"logistic": _logistic, "cross-entropy": _cross_entropy}


def score_outputs(loss: str, outputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[loss sum, number right, count] (float64) of ``outputs`` against ``labels`` under the
    task's loss ``loss`` ('logistic': one logit per sample, labels -1/+1; 'cross-entropy':
    ``[N, classes]`` logits, class indices)."""
    try:
        scorer = _SCORERS[loss]
    except KeyError:
        raise ValueError(f"no scorer for the loss {loss!r}; known: {', '.join(_SCORERS)}") from None
    if outputs.shape[0] != labels.shape[0]:
        raise ValueError(f"{outputs.shape[0]} outputs for {labels.shape[0]} labels")
    loss_sum, correct = scorer(np.asarray(outputs), np.asarray(labels))
    return np.array([loss_sum, correct, float(labels.shape[0])], dtype=np.float64)


def metrics_of(totals: Sequence[float] | np.ndarray, regulariser: float = 0.0) -> dict[str, float]:
    """``eval/loss`` (the mean loss plus the L2 term ``regulariser``) and ``eval/accuracy`` from
    the sums of all workers."""
    loss_sum, correct, count = (float(v) for v in totals)
    return {"loss": loss_sum / count + float(regulariser), "accuracy": correct / count}
