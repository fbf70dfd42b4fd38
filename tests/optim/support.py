"""Helpers of the optimizer tests: real k-process gloo groups, a tiny model, shared data.

Processes come from a forkserver that has imported torch once, so a k-process group costs a
fraction of a second rather than a torch import per process; each call still gets fresh
processes and a fresh group (rendezvous through a file, gloo's sockets on the loopback).
Functions given to :func:`run_on_ranks` must live at module level (they are sent by name).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import traceback
from typing import Any
from collections.abc import Callable

import torch
from torch import nn

from mlbench.tasks.task1a import TASK1A

_CTX = multiprocessing.get_context("forkserver")
# torch.optim imports torch._dynamo on first use: seconds, paid once here instead of per process.
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "mlbench.optim.catalog"])

#: The task-1a hyper-parameters without momentum and weight decay: plain SGD.
PLAIN = TASK1A.with_settings(momentum=0.0, nesterov=False, weight_decay=0.0)


def _entry(fn: Callable[..., Any], rank: int, world: int, store: str, args: tuple, out) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        # Plain pickle copies tensors (the queue's own pickler would share memory that dies
        # with this process).
        out.put((rank, True, pickle.dumps(result)))
    except BaseException:
        out.put((rank, False, traceback.format_exc()))


def run_on_ranks(fn: Callable[..., Any], world: int, *args: Any, store_dir: str,
                 timeout: float = 90) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` processes; the results in rank order."""
    store = os.path.join(store_dir, f"store-{fn.__name__}-{world}")
    if os.path.exists(store):
        os.remove(store)
    out = _CTX.Queue()
    procs = [_CTX.Process(target=_entry, args=(fn, r, world, store, args, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, ok, value = out.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
    except queue.Empty:
        raise AssertionError(f"{fn.__name__} on {world} ranks did not finish in {timeout}s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


class Tiny(nn.Module):
    """A conv layer and a linear layer with biases: 4-d, 2-d and 1-d parameters."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def tiny_model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def tiny_data(samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 3, 8, 8, generator=gen), torch.randint(0, 5, (samples,), generator=gen)


def loss_on(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]
