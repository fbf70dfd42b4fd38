"""A worker's resumable state: written at the run's checkpoint interval and at a clean stop, read
back by `mlbench resume`, so that the resumed run goes on exactly as if it had never stopped.

One rank's file holds everything its next step depends on: the model (parameters and buffers),
the distributed optimizer's own state (:mod:`mlbench.optim.state`: momentum, PowerSGD's Q and
error feedback, ...), the task runtime's (a language model's hidden state, averaged-SGD's
average, a loss scale), where the data order stands (epoch, the index of the next batch in that
epoch, the seed the order is drawn from: the batches of an epoch follow from (seed, epoch), so
the position is all a resume needs), every random generator a step may draw from (torch's on the
CPU and the GPUs, numpy's, Python's), and the counters recorded so far (step, times, the best and
goal values). It is captured between two steps, *before* anything a stop adds (the evaluation at
a stop is a measurement of the stopped model, not part of the training a resume continues).

Each file is written whole or not at all (:func:`mlbench.safefile.replacing`: a partial file,
fsync, rename) and read back for its size and SHA-256; the ranks gather those (which is also
their agreement that all of them wrote), rank 0 writes them into the checkpoint's manifest, last
(:mod:`mlbench.results.checkpoints`: what makes it complete and valid), names it in ``state.json``
and removes the older ones past :data:`~mlbench.results.checkpoints.KEEP`.
The files load with ``torch.load(weights_only=True)``: plain tensors, numbers, lists and dicts.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mlbench.errors import MlbenchError
from mlbench.jsonfile import write_json_atomic
from mlbench.results.checkpoints import (
    KEEP,
    MANIFEST,
    complete_checkpoints,
    file_digest,
    rank_file,
    state_dir,
    write_manifest,
)
from mlbench.safefile import replacing

FORMAT = 1


class CheckpointError(MlbenchError):
    """A checkpoint that cannot be resumed from (missing, unreadable, of another run)."""


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator a training step may draw from, as plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss": python_gauss},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back the generators of :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def write(root: Path, rank: int, world: int, state: dict[str, Any]) -> float:
    """Write rank ``rank``'s ``state`` as the checkpoint of ``state["step"]``; once every rank
    has written (a barrier), rank 0 updates the manifest and prunes. Returns the seconds taken."""
    begin = time.perf_counter()
    step = int(state["step"])
    path = rank_file(root, step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():  # an earlier try of this very step (a resume that stopped at once)
        path.unlink()
    with replacing(path, mode=0o600) as f:
        torch.save(state, f)
    digests: list[Any] = [{"rank": rank, **file_digest(path)}]
    if world > 1 and dist.is_available() and dist.is_initialized():
        gathered: list[Any] = [None] * world   # every rank's file as written, once all have written
        dist.all_gather_object(gathered, digests[0])
        digests = gathered
    if rank == 0:
        if len(digests) == world:
            write_manifest(state_dir(root, step), step,
                           {f"rank-{d['rank']}.pt": {"size": d["size"], "sha256": d["sha256"]} for d in digests})
        done = complete_checkpoints(root, world)
        write_json_atomic(root / MANIFEST, {"newest_step": done.newest, "newest": state_dir(root, step).name,
                                            "steps": list(done.steps), "workers": world,
                                            "written_at": time.time()})
        for old in done.steps[:-KEEP]:
            shutil.rmtree(state_dir(root, old), ignore_errors=True)
    return time.perf_counter() - begin


def read(root: Path, step: int, rank: int, *, seed: int, workers: int, shrunk: bool = False) -> dict[str, Any]:
    """Rank ``rank``'s state of the checkpoint of ``step``, checked to be this run's. ``shrunk``
    (``--on-failure shrink``): a checkpoint of a larger group is this run's too, its files
    renumbered for the survivors by the supervisor (:func:`mlbench.launch.supervisor.renumber_checkpoints`)."""
    path = rank_file(root, step, rank)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"cannot read the checkpoint {path}: {err}") from None
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a checkpoint of another format ({state.get('format')!r}, "
                              f"expected {FORMAT})")
    written_by = state.get("workers")
    if shrunk and state.get("seed") == seed and isinstance(written_by, int) and written_by > workers:
        return state
    if (state.get("seed"), written_by) != (seed, workers):
        raise CheckpointError(f"{path} was written by a run with seed {state.get('seed')} and "
                              f"{state.get('workers')} workers, not seed {seed} and {workers}")
    return state
