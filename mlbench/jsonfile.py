"""JSON files written whole or not at all: run.json, pids.json and the other small records.

They live below every layer (the run store, run.json's :mod:`mlbench.run_config`, the launchers
all write them), so that none of those has to import another for two functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file (synced, one per process, mode 600) and rename, so a
    reader never sees half a file, even after a power loss."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
