"""`mlbench download`: everything recorded about a run, as one zip file.

``run.json`` (spec, division, configuration, environment, state and result), ``metrics.jsonl``
(every event of every worker, ordered by time), ``metrics.csv`` (the same events with numeric
values, for spreadsheets and pandas), and the raw per-worker files under ``events/`` and
``logs/``, and the batch script of a Slurm job (``job.sbatch``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import zipfile
from dataclasses import asdict
from pathlib import Path

from mlbench.results.events import read_run_events
from mlbench.results.store import RunRecord
from mlbench.results.summary import summarize
from mlbench.run_config import RunDocument
from mlbench.safefile import replacing

# files a launcher keeps in the run folder beside run.json: the batch script of a Slurm job
RECORDED_FILES = ("job.sbatch",)


def run_document(run: RunRecord) -> dict:
    """run.json as downloaded: what was asked for plus what happened."""
    document = RunDocument.load_or_none(run.run_dir)
    doc = document.to_dict() if document else {}
    events = read_run_events(run.run_dir)
    summary = summarize(events)
    record = asdict(run)
    record.pop("run_dir", None)
    doc.update({"state": run.state, "reason": run.reason, "result": run.result or summary.result,
                "record": record})
    if summary.environment:
        doc["environment"] = summary.environment
    if summary.skipped_events:
        doc["skipped_event_lines"] = summary.skipped_events
    return doc


def write_archive(run: RunRecord, output: str | os.PathLike) -> Path:
    """Write the zip as ``OUTPUT.part``, then rename it to ``OUTPUT``.

    The partial file is created exclusively and never through a link (:mod:`mlbench.safefile`):
    a file or link already at that name (planted, or left by an interrupted download) is refused,
    not followed or overwritten; the rename replaces a link at ``OUTPUT`` itself, not its target.
    """
    output = Path(output)
    events = read_run_events(run.run_dir)
    with replacing(output) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run.json", json.dumps(run_document(run), indent=2, sort_keys=True, default=str))
        zf.writestr("metrics.jsonl", "".join(json.dumps(e) + "\n" for e in events))
        zf.writestr("metrics.csv", _csv(events))
        for name in RECORDED_FILES:
            if (run.run_dir / name).is_file():
                zf.write(run.run_dir / name, name)
        for sub in ("events", "logs"):
            folder = run.run_dir / sub
            if folder.is_dir():
                for path in sorted(folder.iterdir()):
                    if path.is_file() and not path.is_symlink():  # never what a link points to
                        zf.write(path, f"{sub}/{path.name}")
    return output


def _csv(events: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["time", "rank", "epoch", "step", "name", "value"])
    for e in events:
        value = e.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.writerow([e.get("time"), e.get("rank"), e.get("epoch"), e.get("step"), e["name"], value])
    return buf.getvalue()
