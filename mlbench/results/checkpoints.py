"""Where a run's resumable checkpoints are, and which of them are complete.

A checkpoint of step N is one folder, ``state-step-N``, holding one file per rank
(``rank-R.pt``, each written whole or not at all by :mod:`mlbench.worker.checkpoint`) and, written
last, its manifest ``manifest.json``: every rank's file with its size and SHA-256, gathered from
the ranks once all of them wrote. It is *complete* when its manifest names every rank's file (a
worker killed half-way through a checkpoint leaves an incomplete one, which is ignored and
removed; a checkpoint folder of a run from before manifests, with no manifest in any folder, is
complete when every rank's file is there). It is *valid* when each file is there with the size
and SHA-256 its manifest names (:func:`newest_valid`): a resume or a restart goes on from the
newest valid one and sets aside (``rejected-step-N``) each newer one that fails, naming why.
Rank 0 also names the newest complete one in ``state.json`` beside the folders, for a person or
another tool.

The folders are in ``RUN_DIR/checkpoints`` (beside ``rank-R.pt``, the final parameters of
``--save-model``, which keep that meaning), or in ``--checkpoint-dir DIR/RUN_ID`` on storage that
outlives the run folder. This module reads names and files only (no torch), so that status, the
dashboard and the launchers can tell what a run can resume from.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The folder of a run's checkpoints in its run folder; on a cluster, the folder of the results
#: service's volume that holds every run's (mlbench.launch.k8s_objects.CHECKPOINT_DIR).
CHECKPOINTS_FOLDER = "checkpoints"
#: In the run folder of a run whose checkpoints are on a cluster's volume: their summary
#: (:meth:`Checkpoints.to_dict`), kept there by the cluster's supervisor, which sees the volume,
#: for what reads the run folder elsewhere (the CLI's copy of it, the dashboard): :func:`summary`.
SUMMARY_FILE = "checkpoints.json"
STATE_PREFIX = "state-step-"
MANIFEST = "state.json"
#: In each checkpoint's folder, written last: every rank's file, its size and SHA-256.
CHECKPOINT_MANIFEST = "manifest.json"
REJECTED_PREFIX = "rejected-step-"
#: Complete checkpoints kept: the newest and the one before it (a resume reads the newest).
KEEP = 2
_STATE_DIR = re.compile(rf"^{STATE_PREFIX}(\d+)$")


def checkpoint_root(run_dir: Path, checkpoint_dir: str | None) -> Path:
    """The folder of the run's resumable checkpoints: ``--checkpoint-dir DIR`` gives
    ``DIR/RUN_ID`` (the run folder's name is its id), else ``RUN_DIR/checkpoints``."""
    if checkpoint_dir:
        return Path(checkpoint_dir) / run_dir.name
    return run_dir / CHECKPOINTS_FOLDER


def state_dir(root: Path, step: int) -> Path:
    """The folder of the checkpoint of step ``step``."""
    return root / f"{STATE_PREFIX}{step}"


def rank_file(root: Path, step: int, rank: int) -> Path:
    """Rank ``rank``'s file of the checkpoint of step ``step``."""
    return state_dir(root, step) / f"rank-{rank}.pt"


@dataclass(frozen=True)
class Checkpoints:
    """A run's complete checkpoints, by step (ascending)."""

    root: Path
    steps: tuple[int, ...]

    @property
    def newest(self) -> int | None:
        """The step of the newest complete checkpoint (None: none)."""
        return self.steps[-1] if self.steps else None

    @property
    def count(self) -> int:
        return len(self.steps)

    def to_dict(self) -> dict[str, object]:
        """As `status -o json` and the dashboard show them."""
        return {"newest_step": self.newest, "count": self.count, "folder": str(self.root)}


def file_digest(path: Path) -> dict[str, Any]:
    """A checkpoint file as its manifest names it: its size and SHA-256."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def write_manifest(folder: Path, step: int, files: dict[str, dict[str, Any]]) -> None:
    """The checkpoint's manifest (``files``: name to :func:`file_digest`), written whole or not
    at all, after every file it names."""
    from mlbench.jsonfile import write_json_atomic

    write_json_atomic(folder / CHECKPOINT_MANIFEST, {"step": step, "workers": len(files), "files": files})


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The checkpoint's manifest, None when it has none (or one that is not a manifest)."""
    try:
        data = json.loads((folder / CHECKPOINT_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return None
    return data


def _state_dirs(root: Path) -> list[tuple[int, Path]]:
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    return [(int(m.group(1)), e) for e in entries if (m := _STATE_DIR.match(e.name))]


def _incomplete(folder: Path, workers: int, legacy: bool) -> str | None:
    """Why the checkpoint in ``folder`` is not complete for ``workers`` ranks (None: it is)."""
    names = [f"rank-{r}.pt" for r in range(workers)]
    manifest = read_manifest(folder)
    if manifest is None:
        if legacy and all((folder / name).is_file() for name in names):
            return None
        return "it has no manifest (its writers did not all finish)"
    missing = [name for name in names if name not in manifest["files"]]
    return f"its manifest names no {missing[0]}" if missing else None


def complete_checkpoints(root: Path, workers: int) -> Checkpoints:
    """The checkpoints in ``root`` that every one of ``workers`` ranks wrote: those whose
    manifest names every rank's file (its files are checked by :func:`invalid_reason`)."""
    found = _state_dirs(root)
    legacy = not any((folder / CHECKPOINT_MANIFEST).exists() for _, folder in found)
    return Checkpoints(root, tuple(sorted(step for step, folder in found
                                          if _incomplete(folder, workers, legacy) is None)))


def invalid_reason(root: Path, step: int, workers: int) -> str | None:
    """Why the complete checkpoint of ``step`` cannot be resumed from: a file that is missing,
    or whose size or SHA-256 is not its manifest's (None: every file is as written; a checkpoint
    without a manifest, of a run from before them, is not checked)."""
    folder = state_dir(root, step)
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    for rank in range(workers):
        name = f"rank-{rank}.pt"
        entry = manifest["files"][name]
        try:
            size = (folder / name).stat().st_size
            if size != entry.get("size"):
                return f"{name} is {size:,} bytes, its manifest says {entry.get('size'):,} (truncated or replaced)"
            if file_digest(folder / name)["sha256"] != entry.get("sha256"):
                return f"{name}'s SHA-256 is not its manifest's (it changed after it was written)"
        except OSError as err:
            return f"{name} cannot be read ({err.strerror or err})"
    return None


@dataclass(frozen=True)
class Rejected:
    """A complete checkpoint that failed its check."""

    step: int
    reason: str

    def line(self, folder: Path) -> str:
        return f"the checkpoint of step {self.step} ({folder}) is skipped: {self.reason}"


def newest_valid(root: Path, workers: int) -> tuple[int | None, list[Rejected]]:
    """The step of the newest valid checkpoint (None: none), and each newer complete one that
    failed its check (newest first)."""
    rejected: list[Rejected] = []
    for step in reversed(complete_checkpoints(root, workers).steps):
        reason = invalid_reason(root, step, workers)
        if reason is None:
            return step, rejected
        rejected.append(Rejected(step, reason))
    return None, rejected


def set_aside(root: Path, step: int) -> Path:
    """Move a rejected checkpoint out of the way of its step's next write (kept as
    ``rejected-step-N`` for a person to look at; a later rejection of the step replaces it)."""
    target = root / f"{REJECTED_PREFIX}{step}"
    shutil.rmtree(target, ignore_errors=True)
    os.replace(state_dir(root, step), target)
    return target


def summary(run_dir: Path, root: Path, workers: int) -> dict[str, object]:
    """The run's complete checkpoints as `status` shows them (:meth:`Checkpoints.to_dict`): read
    from ``root`` where this machine has it, else from the run folder's :data:`SUMMARY_FILE`
    (a cluster run's, whose checkpoints are on the cluster's volume)."""
    kept = run_dir / SUMMARY_FILE
    if not root.is_dir() and kept.is_file():
        try:
            data = json.loads(kept.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and {"newest_step", "count", "folder"} <= set(data):
            return data
    return complete_checkpoints(root, workers).to_dict()


def discard_incomplete_checkpoints(root: Path, workers: int) -> None:
    """Remove the checkpoint folders newer than the newest complete one: a worker killed while
    writing left its partial file there, in the way of the same step's next write. Call it only
    while no worker of the run is alive (they are the only writers)."""
    newest = complete_checkpoints(root, workers).newest
    for step, folder in _state_dirs(root):
        if newest is None or step > newest:
            shutil.rmtree(folder, ignore_errors=True)


def renumber_checkpoints(root: Path, workers: int, survivors: list[int]) -> None:
    """``--on-failure shrink``: make every complete checkpoint of ``workers`` ranks one of the
    survivors' group: the other ranks' files go, survivor ``survivors[j]``'s file becomes rank
    j's (ascending, so a rename never lands on a file still to be moved), and the manifest says
    so. The model and an all-reduce optimizer's state are the same on every rank; each survivor
    keeps its own random generators. Call it only while no worker of the run is alive."""
    keep = sorted(survivors)
    for step in complete_checkpoints(root, workers).steps:
        folder = root / f"{STATE_PREFIX}{step}"
        manifest = read_manifest(folder)
        for rank in set(range(workers)) - set(keep):
            (folder / f"rank-{rank}.pt").unlink(missing_ok=True)
        for new, old in enumerate(keep):
            if new != old:
                os.replace(folder / f"rank-{old}.pt", folder / f"rank-{new}.pt")
        if manifest is not None:
            write_manifest(folder, step, {f"rank-{new}.pt": manifest["files"][f"rank-{old}.pt"]
                                          for new, old in enumerate(keep)})
