"""JSON files written whole or not at all: run.json, pids.json and the other small records.

They live below every layer (the run store, run.json's :mod:`mlbench.run_config`, the launchers
all write them), so that none of those has to import another for two functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlbench.safefile import write_text


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a partial file (synced, one per call, mode 600, never through a link) and
    rename, so a reader never sees half a file, even after a power loss."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", mode=0o600, unique=True)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
