"""Where a run's resumable checkpoints are, and which of them are complete.

A checkpoint of step N is one folder, ``state-step-N``, holding one file per rank
(``rank-R.pt``, each written whole or not at all by :mod:`mlbench.worker.checkpoint`). It is
*complete* when every rank of the run wrote its file: only then can the run resume from it (a
worker killed half-way through a checkpoint leaves an incomplete one, which is ignored). After
the ranks agreed that they all wrote, rank 0 names the newest complete one in the manifest
``state.json`` beside the folders, for a person or another tool; mlbench itself trusts the
folders, so a lost manifest loses nothing.

The folders are in ``RUN_DIR/checkpoints`` (beside ``rank-R.pt``, the final parameters of
``--save-model``, which keep that meaning), or in ``--checkpoint-dir DIR/RUN_ID`` on storage that
outlives the run folder. This module reads names and files only (no torch), so that status, the
dashboard and the launchers can tell what a run can resume from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

#: The folder of a run's checkpoints in its run folder; on a cluster, the folder of the results
#: service's volume that holds every run's (mlbench.launch.k8s_objects.CHECKPOINT_DIR).
CHECKPOINTS_FOLDER = "checkpoints"
#: In the run folder of a run whose checkpoints are on a cluster's volume: their summary
#: (:meth:`Checkpoints.to_dict`), kept there by the cluster's supervisor, which sees the volume,
#: for what reads the run folder elsewhere (the CLI's copy of it, the dashboard): :func:`summary`.
SUMMARY_FILE = "checkpoints.json"
STATE_PREFIX = "state-step-"
MANIFEST = "state.json"
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


def complete_checkpoints(root: Path, workers: int) -> Checkpoints:
    """The checkpoints in ``root`` that every one of ``workers`` ranks wrote."""
    steps = []
    try:
        entries = list(root.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        match = _STATE_DIR.match(entry.name)
        if match and all((entry / f"rank-{r}.pt").is_file() for r in range(workers)):
            steps.append(int(match.group(1)))
    return Checkpoints(root, tuple(sorted(steps)))


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
    for entry in root.glob(f"{STATE_PREFIX}*"):
        step = entry.name.removeprefix(STATE_PREFIX)
        if step.isdigit() and (newest is None or int(step) > newest):
            shutil.rmtree(entry, ignore_errors=True)


def renumber_checkpoints(root: Path, workers: int, survivors: list[int]) -> None:
    """``--on-failure shrink``: make every complete checkpoint of ``workers`` ranks one of the
    survivors' group: the other ranks' files go, survivor ``survivors[j]``'s file becomes rank
    j's (ascending, so a rename never lands on a file still to be moved). The model and an
    all-reduce optimizer's state are the same on every rank; each survivor keeps its own random
    generators. Call it only while no worker of the run is alive."""
    keep = sorted(survivors)
    for step in complete_checkpoints(root, workers).steps:
        folder = root / f"{STATE_PREFIX}{step}"
        for rank in set(range(workers)) - set(keep):
            (folder / f"rank-{rank}.pt").unlink(missing_ok=True)
        for new, old in enumerate(keep):
            if new != old:
                os.replace(folder / f"rank-{old}.pt", folder / f"rank-{new}.pt")
