"""The state of torch's PowerSGD communication hook, kept resumable.

torch's hook (``powerSGD_hook`` with a ``PowerSGDState``) carries from step to step an error
feedback, P and Q memories, a step counter and a numpy generator; the first three are flat
tensors *per DDP bucket*, keyed by the bucket's index. A bucket's layout is not stable: DDP puts
every gradient in one bucket for its first step and rebuilds the buckets in the order the
gradients became ready for its second (the reason torch requires ``start_powerSGD_iter >= 2``).
A resumed process starts that again, so the state of the buckets it was saved in does not fit
the buckets of the resumed process's first step, nor perhaps of its later ones.

:class:`ResumablePowerSGD` therefore keeps a checkpoint of the state *per parameter* (each
parameter's slice of its bucket's error, and its P and Q when it is compressed) and wraps the hook:
when a bucket arrives whose parameters are not the ones its state was built for, the state of the
buckets that shared a parameter with it is cut into per-parameter pieces and the bucket's own is
assembled from them, in the layout torch's hook expects (error: the bucket's parameters in order;
P and Q: the compressed parameters grouped by shape in order of first appearance). Every piece of
the hook's arithmetic is per parameter (error feedback, the per-matrix compression; the all-reduces
are element-wise), so the result is the very one of an uninterrupted run.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
from collections import defaultdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

_PIECES = ("error", "p", "q")
_COUNTERS = ("iter", "total_numel_before_compression", "total_numel_after_compression", "next_stats_report")


class ResumablePowerSGD:
    """torch's PowerSGD hook on ``state``, with a state that survives a change of buckets."""

    def __init__(self, state: powerSGD_hook.PowerSGDState, params: list[torch.nn.Parameter]):
        self.state = state
        self.index = {id(p): i for i, p in enumerate(params)}
        self.shapes = [tuple(p.shape) for p in params]
        self.layouts: dict[int, tuple[int, ...]] = {}   # bucket index -> its parameters' indices
        self.pending: dict[str, dict[int, torch.Tensor]] = {name: {} for name in _PIECES}
        #: The buckets of the checkpoint resumed from (index -> parameters), until DDP's own match.
        self.saved_layouts: dict[int, tuple[int, ...]] = {}

    def hook(self, state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        layout = tuple(self.index[id(p)] for p in bucket.parameters())
        parts = self._saved_parts(layout)
        if parts:
            return self._in_saved_buckets(state, bucket, layout, parts)
        if self.layouts.get(bucket.index()) != layout:
            self._relayout(bucket.index(), layout)
        return powerSGD_hook.powerSGD_hook(state, bucket)

    # -- the buckets of the checkpoint ------------------------------------------------------------
    def _saved_parts(self, layout: tuple[int, ...]) -> list[int]:
        """The checkpoint's buckets that ``layout`` (a bucket of another layout) is made of, in
        their order; none when it is one of them or is not made of them."""
        if not self.saved_layouts or layout in self.saved_layouts.values():
            self.saved_layouts.clear()  # DDP's buckets are the checkpoint's again
            return []
        members = set(layout)
        parts = sorted(b for b, saved in self.saved_layouts.items() if set(saved) <= members)
        covered = [i for b in parts for i in self.saved_layouts[b]]
        return parts if sorted(covered) == sorted(layout) else []

    def _in_saved_buckets(self, state: powerSGD_hook.PowerSGDState, bucket: dist.GradBucket,
                          layout: tuple[int, ...], parts: list[int]) -> torch.futures.Future[torch.Tensor]:
        """Run the hook on copies of ``bucket``'s gradients laid out as the checkpoint's buckets
        (the same arithmetic on the same memory offsets as before the stop: the matrix products'
        blocking, hence their rounding, depends on them), then copy the results back."""
        grads = dict(zip(layout, bucket.gradients()))
        for n, part in enumerate(parts):
            saved = self.saved_layouts[part]
            buffer = torch.cat([grads[i].reshape(-1) for i in saved])
            copy = _Bucket(part, buffer, [self.shapes[i] for i in saved],
                           bucket.is_last() and n == len(parts) - 1)
            if self.layouts.get(part) != saved:
                self._relayout(part, saved)
            result = powerSGD_hook.powerSGD_hook(state, copy).wait()  # type: ignore[arg-type]
            offset = 0
            for i in saved:
                numel = grads[i].numel()
                grads[i].copy_(result[offset:offset + numel].view_as(grads[i]))
                offset += numel
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    # -- layouts ----------------------------------------------------------------------------------
    def _compressed(self, layout: tuple[int, ...]) -> list[int]:
        """The parameters of ``layout`` the hook compresses, in the order of its P and Q memories."""
        rank, rate = self.state.matrix_approximation_rank, self.state.min_compression_rate
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i in layout:
            n = self.shapes[i][0] if self.shapes[i] else 1
            m = int(np.prod(self.shapes[i])) // n if n else 0
            if powerSGD_hook._should_compress(n, m, min(n, m, rank), rate)[0]:
                groups[(n, m)].append(i)
        return [i for members in groups.values() for i in members]

    def _sizes(self, i: int) -> tuple[int, int, int]:
        """Parameter ``i``'s numbers of elements in the error, P and Q."""
        shape = self.shapes[i]
        numel = int(np.prod(shape))
        n = shape[0] if shape else 1
        m = numel // n if n else 0
        r = min(n, m, self.state.matrix_approximation_rank)
        return numel, n * r, m * r

    def _cut(self, bucket: int, out: dict[str, dict[int, torch.Tensor]]) -> None:
        """Bucket ``bucket``'s state as per-parameter pieces, into ``out``."""
        layout = self.layouts[bucket]
        error = self.state.error_dict.get(bucket)
        if error is not None:
            offset = 0
            for i in layout:
                numel = self._sizes(i)[0]
                out["error"][i] = error[offset:offset + numel].clone()
                offset += numel
        p, q = self.state.p_memory_dict.get(bucket), self.state.q_memory_dict.get(bucket)
        if p is not None and q is not None:
            p_at = q_at = 0
            for i in self._compressed(layout):
                _, p_n, q_n = self._sizes(i)
                out["p"][i], out["q"][i] = p[p_at:p_at + p_n].clone(), q[q_at:q_at + q_n].clone()
                p_at, q_at = p_at + p_n, q_at + q_n

    def _relayout(self, bucket: int, layout: tuple[int, ...]) -> None:
        members = set(layout)
        for old in [b for b, old_layout in self.layouts.items() if members & set(old_layout)]:
            self._cut(old, self.pending)
            for memory in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
                memory.pop(old, None)
            del self.layouts[old]
        self.layouts[bucket] = layout
        error, p, q = (self.pending[name] for name in _PIECES)
        if layout and all(i in error for i in layout):
            self.state.error_dict[bucket] = torch.cat([error.pop(i) for i in layout])
        compressed = self._compressed(layout)
        if compressed and all(i in p and i in q for i in compressed):
            self.state.p_memory_dict[bucket] = torch.cat([p.pop(i) for i in compressed])
            self.state.q_memory_dict[bucket] = torch.cat([q.pop(i) for i in compressed])

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The hook's state per parameter, its counters and generator (plain values, CPU tensors)."""
        pieces: dict[str, dict[int, torch.Tensor]] = {name: dict(self.pending[name]) for name in _PIECES}
        for bucket in self.layouts:
            self._cut(bucket, pieces)
        kind, keys, pos, has_gauss, gauss = self.state.rng.get_state()
        return {"layouts": {b: list(layout) for b, layout in self.layouts.items()},
                **{name: {i: t.detach().cpu() for i, t in pieces[name].items()} for name in _PIECES},
                **{name: int(getattr(self.state, name)) for name in _COUNTERS},
                "rng": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                        "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)}}

    def load_state_dict(self, saved: dict[str, Any], device: torch.device) -> None:
        """Continue from ``saved`` (:meth:`state_dict` of the same run's hook, any bucket layout)."""
        for name in _COUNTERS:
            setattr(self.state, name, int(saved[name]))
        rng = saved["rng"]
        self.state.rng.set_state((rng["kind"], rng["keys"].numpy().astype(np.uint32), rng["pos"],
                                  rng["has_gauss"], rng["gauss"]))
        for memory in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            memory.clear()
        self.layouts.clear()
        self.saved_layouts = {int(b): tuple(int(i) for i in layout) for b, layout in saved["layouts"].items()}
        self.pending = {name: {int(i): t.to(device) for i, t in saved[name].items()} for name in _PIECES}


class _Bucket:
    """What torch's PowerSGD hook reads of a DDP bucket, for a flat ``buffer`` of parameters
    of ``shapes``."""

    def __init__(self, index: int, buffer: torch.Tensor, shapes: list[tuple[int, ...]], last: bool):
        self._index, self._buffer, self._last = index, buffer, last
        self._gradients, offset = [], 0
        for shape in shapes:
            numel = int(np.prod(shape))
            self._gradients.append(buffer[offset:offset + numel].view(shape))
            offset += numel

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._gradients

    def is_last(self) -> bool:
        return self._last
