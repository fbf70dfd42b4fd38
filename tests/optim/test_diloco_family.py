"""diloco, streaming-diloco and sparseloco on real gloo processes equal a one-process simulation
of k workers written here from each paper's update (not from mlbench's code): every rank's own
model, the global model that evaluation scores, and the bytes each rank reports."""

from __future__ import annotations

import re

import pytest
import torch

from mlbench.optim.base import OptimizerContext, allgather_bytes, allreduce_bytes, flat_params
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.task1a import TASK1A
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.helpers import mlbench
from tests.optim.support import loss_on, tiny_data, tiny_model

LR, BATCH = 0.5, 4
RTOL, ATOL = 1e-5, 1e-6


def batch_of(x: torch.Tensor, y: torch.Tensor, step: int, rank: int, world: int):
    lo = (step * world + rank) * BATCH
    return x[lo:lo + BATCH], y[lo:lo + BATCH]


def train(rank: int, world: int, name: str, options: dict[str, str], steps: int) -> dict:
    """``steps`` steps of the optimizer on rank ``rank``'s batches; its own model, the model its
    evaluation sees, whether evaluation gave its own back, and the bytes it reports."""
    model = tiny_model()
    ctx = OptimizerContext(model=model, hyper=task_hyper(TASK1A, world), world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options=options)
    opt = build_optimizer(name, ctx)
    x, y = tiny_data(steps * world * BATCH)
    for step in range(steps):
        opt.zero_grad()
        loss_on(opt.module, *batch_of(x, y, step, rank, world)).backward()
        opt.step(LR)
    own = flat_params(opt.params).clone()
    restore = opt.state_for_eval()
    deployed = flat_params(opt.params).clone()
    if restore is not None:
        restore()
    return {"own": own, "deployed": deployed, "restored": torch.equal(flat_params(opt.params), own),
            "bytes": opt.bytes_sent}


# -- the papers' updates, k workers simulated in one process ------------------------------------
class Workers:
    """k copies of the model, each with its inner AdamW (weight decay 0.1, rate LR x 0.08) or the
    task's SGD, trained on the batches each rank would see."""

    def __init__(self, world: int, steps: int, inner: str = "adamw"):
        self.world = world
        self.models = [tiny_model() for _ in range(world)]
        s = TASK1A.settings
        self.inners = [torch.optim.AdamW(m.parameters(), lr=LR * 0.08, weight_decay=0.1) if inner == "adamw" else
                       torch.optim.SGD(m.parameters(), lr=LR, momentum=s.momentum, nesterov=s.nesterov,
                                       weight_decay=s.weight_decay)
                       for m in self.models]
        self.data = tiny_data(steps * world * BATCH)
        self.global_ = [p.detach().clone() for p in self.models[0].parameters()]

    def inner_step(self, step: int) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # as each rank computes: the same summation order, the same bits
        try:
            self._inner_step(step)
        finally:
            torch.set_num_threads(threads)

    def _inner_step(self, step: int) -> None:
        for rank, (model, inner) in enumerate(zip(self.models, self.inners)):
            inner.zero_grad()
            loss_on(model, *batch_of(*self.data, step, rank, self.world)).backward()
            inner.step()

    def param(self, rank: int, i: int) -> torch.Tensor:
        return list(self.models[rank].parameters())[i]

    def result(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        return ([torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in self.models],
                torch.cat([g.reshape(-1) for g in self.global_]))


def nesterov(global_: torch.Tensor, mean_delta: torch.Tensor, momentum: torch.Tensor, lr: float, mu: float):
    """Outer SGD with Nesterov momentum: m <- mu m + d; theta <- theta - lr (d + mu m). (Written with
    torch.add's alpha, as torch.optim.SGD is: a 16-bit pseudo-gradient turns a last-bit difference
    upstream into a whole 16-bit step, so the float operations must be the same ones.)"""
    new_momentum = momentum * mu + mean_delta
    return global_.add(mean_delta.add(new_momentum, alpha=mu), alpha=-lr), new_momentum


def simulate_diloco(world: int, steps: int, h: int, outer_lr: float, mu: float, inner: str = "adamw"):
    """DiLoCo, Algorithm 1: every H inner steps, theta <- OuterOpt(theta, mean_i(theta - theta_i))."""
    w = Workers(world, steps, inner)
    momentum = [torch.zeros_like(g) for g in w.global_]
    for step in range(steps):
        w.inner_step(step)
        if (step + 1) % h == 0:
            with torch.no_grad():
                for i in range(len(w.global_)):
                    mean_delta = sum(w.global_[i] - w.param(r, i) for r in range(world)) / world
                    w.global_[i], momentum[i] = nesterov(w.global_[i], mean_delta, momentum[i], outer_lr, mu)
                    for r in range(world):
                        w.param(r, i).copy_(w.global_[i])
    return w.result()


def simulate_streaming(world: int, steps: int, h: int, fragments: int, tau: int, alpha: float,
                       dtype: torch.dtype, pattern: str = "sequential", outer_lr: float = 0.7, mu: float = 0.9):
    """Streaming DiLoCo on the flattened model: fragment f (the f-th of ``fragments`` equal pieces,
    or the tensors i with i mod P = f) sends theta_f - theta_{i,f} at the steps (f+1) H/P + n H,
    quantised to ``dtype`` and summed there; tau steps later its outer step lands and each
    worker's part becomes (1 - alpha) theta_f + alpha theta_{i,f}."""
    w = Workers(world, steps)
    sizes = [g.numel() for g in w.global_]
    n = sum(sizes)
    if pattern == "sequential":
        cuts = [n * f // fragments for f in range(fragments + 1)]
        parts = [torch.arange(cuts[f], cuts[f + 1]) for f in range(fragments)]
    else:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        parts = [torch.cat([torch.arange(starts[i], starts[i] + sizes[i]) for i in range(f, len(sizes), fragments)])
                 for f in range(fragments)]
    global_ = torch.cat([g.reshape(-1) for g in w.global_])
    momentum = torch.zeros(n)
    every = h // fragments
    pending: list = []   # [fragment, step it lands, summed quantised pseudo-gradient]

    def flat(rank: int) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in w.models[rank].parameters()])

    def write(rank: int, values: torch.Tensor) -> None:
        offset = 0
        for p in w.models[rank].parameters():
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def land() -> None:
        fragment, _, total = pending.pop()
        idx = parts[fragment]
        global_[idx], momentum[idx] = nesterov(global_[idx], total.to(torch.float32) / world, momentum[idx],
                                               outer_lr, mu)
        for r in range(world):
            mine = flat(r)
            mine[idx] = torch.lerp(global_[idx], mine[idx], alpha)   # (1 - alpha) theta_f + alpha theta_{i,f}
            write(r, mine)

    for step in range(1, steps + 1):
        w.inner_step(step - 1)
        with torch.no_grad():
            if pending and pending[0][1] == step:
                land()
            if step % every == 0:
                fragment = (step // every - 1) % fragments
                idx = parts[fragment]
                total = torch.zeros(idx.numel())
                for r in range(world):
                    total = total + (global_[idx] - flat(r)[idx]).to(dtype).to(torch.float32)
                pending.append([fragment, step + tau, total.to(dtype)])
                if tau == 0:
                    land()
    offset = 0
    for i, g in enumerate(w.global_):
        w.global_[i] = global_[offset:offset + g.numel()].view_as(g)
        offset += g.numel()
    return w.result()


def simulate_sparseloco(world: int, steps: int, h: int, density: float, chunk: int, beta: float, lr: float):
    """SparseLoCo: e_i <- beta e_i + (theta - theta_i); s_i <- TopK per chunk of e_i; e_i <- e_i - s_i;
    theta <- theta - lr mean_i(s_i); every worker restarts from theta."""
    w = Workers(world, steps)
    n = sum(g.numel() for g in w.global_)
    errors = [torch.zeros(n) for _ in range(world)]
    for step in range(steps):
        w.inner_step(step)
        if (step + 1) % h:
            continue
        with torch.no_grad():
            global_flat = torch.cat([g.reshape(-1) for g in w.global_])
            total = torch.zeros(n)
            for r in range(world):
                own = torch.cat([p.detach().reshape(-1) for p in w.models[r].parameters()])
                errors[r] = beta * errors[r] + (global_flat - own)
                sparse = torch.zeros(n)
                for start in range(0, n, chunk):
                    part = errors[r][start:start + chunk]
                    keep = part.abs().topk(max(1, round(density * part.numel()))).indices + start
                    sparse[keep] = errors[r][keep]
                errors[r] = errors[r] - sparse
                total += sparse
            global_flat = global_flat - lr * total / world
            offset = 0
            for i, g in enumerate(w.global_):
                w.global_[i] = global_flat[offset:offset + g.numel()].view_as(g).clone()
                offset += g.numel()
                for r in range(world):
                    w.param(r, i).copy_(w.global_[i])
    return w.result()


def assert_matches(results: list[dict], own: list[torch.Tensor], global_: torch.Tensor) -> None:
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["own"], own[rank], rtol=RTOL, atol=ATOL, msg=f"rank {rank}'s own model")
        torch.testing.assert_close(res["deployed"], global_, rtol=RTOL, atol=ATOL,
                                   msg=f"rank {rank} evaluates the global model")
        assert res["restored"], f"rank {rank} did not get its own model back after evaluation"
    assert not torch.allclose(own[0], global_), "the last steps are local: the test would not tell the two apart"


NUMEL = sum(p.numel() for p in tiny_model().parameters())


@pytest.mark.parametrize("world,options", [
    (2, {"H": "3"}),                                                      # the paper's outer lr 0.7, momentum 0.9
    (3, {"H": "2", "outer_lr": "0.5", "outer_momentum": "0.6"}),
    (2, {"H": "3", "inner": "sgd"}),                                      # the task's SGD as the inner optimizer
])
def test_diloco_equals_the_papers_algorithm(on_ranks, world, options):
    h = int(options["H"])
    steps = 3 * h + 1   # ends one step into a round
    results = on_ranks(train, world, "diloco", options, steps)
    own, global_ = simulate_diloco(world, steps, h, float(options.get("outer_lr", 0.7)),
                                   float(options.get("outer_momentum", 0.9)), options.get("inner", "adamw"))
    assert_matches(results, own, global_)
    assert results[0]["bytes"] == (steps // h) * allreduce_bytes(NUMEL, 4, world)


@pytest.mark.parametrize("world,options,dtype", [
    (2, {"H": "4", "fragments": "2", "overlap": "1", "alpha": "0.5"}, torch.float32),
    (3, {"H": "6", "fragments": "3", "overlap": "1", "alpha": "0.25", "pattern": "strided"}, torch.float32),
    (2, {"H": "4", "fragments": "2", "overlap": "0", "alpha": "0"}, torch.float32),
    (2, {"H": "4", "fragments": "4", "overlap": "0", "alpha": "0.5", "outer_dtype": "bf16",
         "pattern": "strided"}, torch.bfloat16),
    (2, {"H": "6", "fragments": "3", "overlap": "1", "alpha": "0.5", "outer_dtype": "fp16"}, torch.float16),
])
def test_streaming_diloco_equals_the_papers_algorithm(on_ranks, world, options, dtype):
    steps = 11   # ends with a fragment in flight (sent at step 10, lands at 11 or never)
    h, fragments, pattern = int(options["H"]), int(options["fragments"]), options.get("pattern", "sequential")
    results = on_ranks(train, world, "streaming-diloco", options, steps)
    own, global_ = simulate_streaming(world, steps, h, fragments, int(options["overlap"]),
                                      float(options["alpha"]), dtype, pattern)
    assert_matches(results, own, global_)
    tensors = [p.numel() for p in tiny_model().parameters()]
    sizes = ([sum(tensors[f::fragments]) for f in range(fragments)] if pattern == "strided" else
             [NUMEL * (f + 1) // fragments - NUMEL * f // fragments for f in range(fragments)])
    every = h // fragments
    sent = sum(allreduce_bytes(sizes[(s // every - 1) % fragments], dtype.itemsize, world)
               for s in range(every, steps + 1, every))
    assert results[0]["bytes"] == sent


@pytest.mark.parametrize("world", [2, 3])
def test_sparseloco_equals_the_papers_algorithm(on_ranks, world):
    steps, h, density, chunk = 7, 3, 0.1, 100
    options = {"H": str(h), "density": str(density), "chunk": str(chunk), "ef_decay": "0.9", "outer_lr": "0.8"}
    results = on_ranks(train, world, "sparseloco", options, steps)
    own, global_ = simulate_sparseloco(world, steps, h, density, chunk, 0.9, 0.8)
    assert_matches(results, own, global_)
    chosen = (NUMEL // chunk) * round(density * chunk) + max(1, round(density * (NUMEL % chunk)))
    # each round: an all-gather of the chosen entries' int32 indices and fp32 values
    assert results[0]["bytes"] == (steps // h) * allgather_bytes(chosen * 8, world)


@pytest.mark.parametrize("name,options", [
    ("diloco", ["--opt", "H=2"]),
    ("streaming-diloco", ["--opt", "H=4", "--opt", "outer_dtype=bf16"]),
    ("sparseloco", ["--opt", "H=2", "--opt", "chunk=512"]),
])
def test_the_bytes_each_reports_are_the_bytes_its_sockets_sent(name, options):
    """`mlbench check-optimizer` over three of the method's rounds: the reported bytes against the
    TCP payload of each process's sockets, every rank evaluating the same (global) model."""
    proc = mlbench("check-optimizer", name, *options, "--steps", "6", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = dict(re.findall(r"^  (?:PASS) +(\S+) +(.*)$", proc.stdout, re.M))
    assert set(rows) == {"bytes", "consensus", "restore", "communication", "progress", "memory", "random-stream",
                         "determinism", "finite"}, proc.stdout
    reported = int(re.match(r"reported ([\d,]+) B", rows["bytes"])[1].replace(",", ""))
    assert reported > 0, rows["bytes"]
