"""PowerSGD on real gloo processes against a single-process power iteration (Vogels et al. 2019)."""

from __future__ import annotations

import torch

from mlbench.optim.powersgd import PowerCompressor

SHAPES = ((6, 3, 2, 2), (5, 8), (7,))     # a conv kernel (6 x 12), a matrix, a bias


def random_grads(rank: int, step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(shape, generator=gen) for shape in SHAPES]


def compress_steps(rank: int, world: int, rank_r: int, steps: int) -> dict:
    """``steps`` rounds of compression of fresh random gradients; what went in and came out."""
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    compressor = PowerCompressor(params, rank_r)
    first_q = {i: q.clone() for i, q in compressor.q.items()}
    before, after = [], []
    for step in range(steps):
        grads = random_grads(rank, step)
        before.append([g.clone() for g in grads])
        compressor.reduce_(grads, world)
        after.append(grads)
    return {"q0": first_q, "before": before, "after": after, "memory": compressor.memory}


def mean_gradient(step: int, world: int) -> list[torch.Tensor]:
    return [torch.stack(gs).mean(0) for gs in zip(*(random_grads(r, step) for r in range(world)))]


def power_iteration(mean: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One power-iteration step from Q on one process: the projection of M onto span(M Q)."""
    matrix = mean.reshape(mean.shape[0], -1)
    basis, _ = torch.linalg.qr(matrix @ q)
    return (basis @ (basis.t() @ matrix)).view_as(mean)


def test_k_workers_equal_one_power_iteration_on_the_mean_gradient_with_the_same_q(on_ranks):
    results = on_ranks(compress_steps, 3, 1, 1)
    mean = mean_gradient(0, 3)
    for res in results:
        got = res["after"][0]
        for i in (0, 1):
            torch.testing.assert_close(got[i], power_iteration(mean[i], res["q0"][i]), atol=1e-5, rtol=1e-4)
            assert torch.linalg.matrix_rank(got[i].reshape(SHAPES[i][0], -1)) == 1
        torch.testing.assert_close(got[2], mean[2])        # the bias travels uncompressed
        assert not torch.allclose(got[1], mean[1], atol=1e-3)


def test_rank_at_least_min_n_m_is_exact(on_ranks):
    results = on_ranks(compress_steps, 2, 12, 1)           # min(n, m) is 6 and 5
    mean = mean_gradient(0, 2)
    for got, want in zip(results[0]["after"][0], mean):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    # Each rank's memory is its gradient minus the mean it sent: nothing is lost overall. The two
    # memories add up to twice (mean - sent), so their bound is twice the one above (float32's
    # rounding in the QR of a full-rank matrix, which varies with the CPU's vector unit: 1.3e-5
    # was seen against a bound of 1e-5 that ignored the values' size).
    for i in (0, 1):
        total = sum(res["memory"][i] for res in results)
        bound = 2 * (1e-5 + 1e-4 * mean[i].reshape(total.shape).abs())
        assert (total.abs() <= bound).all(), (total.abs() - bound).max()


def test_memory_plus_sent_equals_the_accumulated_gradient(on_ranks):
    steps = 5
    results = on_ranks(compress_steps, 2, 1, steps)
    for res in results:
        for i in (0, 1):
            accumulated = sum(res["before"][t][i] for t in range(steps))
            sent = sum(res["after"][t][i] for t in range(steps))
            memory = res["memory"][i].view_as(accumulated)
            assert memory.abs().max() > 0.1                 # compression lost something...
            torch.testing.assert_close(memory + sent, accumulated, atol=1e-4, rtol=1e-4)  # ...and kept it
    for t in range(steps):                                   # every rank applies the same update
        for a, b in zip(results[0]["after"][t], results[1]["after"][t]):
            assert torch.equal(a, b)


def test_warm_start_keeps_q_and_improves_the_approximation(on_ranks):
    """Repeated compression of one fixed gradient converges to its best rank-r approximation."""
    results = on_ranks(repeat_one_gradient, 2)
    errors = results[0]
    assert errors[-1] < errors[0]
    assert abs(errors[-1] - errors_of_best_rank_one()) < 1e-3


def repeat_one_gradient(rank: int, world: int) -> list[float]:
    params = [torch.nn.Parameter(torch.zeros(5, 8))]
    compressor = PowerCompressor(params, 1, error_feedback=False)
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(5, 8, generator=gen) + torch.outer(torch.arange(5.0), torch.ones(8))
    errors = []
    for _ in range(30):
        grads = [target.clone()]
        compressor.reduce_(grads, world)
        errors.append(float((grads[0] - target).norm()))
    return errors


def errors_of_best_rank_one() -> float:
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(5, 8, generator=gen) + torch.outer(torch.arange(5.0), torch.ones(8))
    s = torch.linalg.svdvals(target)
    return float(s[1:].pow(2).sum().sqrt())
