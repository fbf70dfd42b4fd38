"""`mlbench run ... --log-to TOOL:DIR`: a run written into TensorBoard, MLflow or W&B while it
trains, by the process that follows it (docs/exporters.md, "Live export").

The same translation and the same writers as `mlbench export` (:mod:`mlbench.results.export`,
:mod:`mlbench.results.exporters`), fed in batches: each look of the follow loop reads what every
rank appended to its event file since the last look, and the run's end writes the summary and
closes the run with its final state. So the tool ends up holding what `mlbench export` of the
ended run would write, and shows the curves as they grow.

An export is a view, never a part of the run: a tool that fails half-way (a full disk, a store
that holds the run already) is dropped with one line said, and the run goes on; `mlbench
export` can write it again after the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlbench.errors import UsageError
from mlbench.results.events import EventTail, events_path, read_run_events
from mlbench.results.export import Point, SeriesNames, event_points, fault_points, run_head, summary_values
from mlbench.results.exporters import TOOLS, WRITERS, Writer, check_library, shut_down, writable_folder
from mlbench.results.store import RunRecord
from mlbench.results.summary import summarize

#: One ``--log-to`` target: the tool and its folder.
Target = tuple[str, Path]


def parse_targets(values: Sequence[str]) -> tuple[Target, ...]:
    """``--log-to TOOL:DIR`` values as targets; before any run exists (and without leaving a
    folder it created for the check), a usage error for a malformed one, an unknown tool or a
    ``DIR`` that cannot be created and written, and MissingExtra for a tool whose library (pip
    extra) is missing."""
    targets = []
    for value in values:
        tool, sep, folder = value.partition(":")
        if not sep or not folder:
            raise UsageError(f"--log-to {value}: give TOOL:DIR, TOOL one of {', '.join(TOOLS)}")
        if tool not in TOOLS:
            raise UsageError(f"--log-to {value}: unknown tool {tool!r}; choose from {', '.join(TOOLS)}")
        check_library(tool, "--log-to")
        path = Path(folder).expanduser()
        writable_folder(path, f"--log-to {value}", keep=False)
        targets.append((tool, path))
    return tuple(targets)


class LiveExport:
    """The ``--log-to`` writers of one followed run."""

    def __init__(self, targets: Sequence[Target], record: RunRecord, say: Callable[[str], None]):
        self.say = say
        self.record = record
        self.tails = [EventTail(events_path(record.run_dir, r)) for r in range(record.workers)]
        self.step = 0
        self.names = SeriesNames(record.id)
        self.writers: list[Writer] = []
        head = run_head(record)
        for tool, folder in targets:
            try:
                writable_folder(folder, f"--log-to {tool}:{folder}")
                problem = WRITERS[tool].conflict(folder, head)
                if problem:
                    raise UsageError(problem)
                self.writers.append(WRITERS[tool](folder, head))
            except Exception as err:  # a view only: the run goes on without it
                self.say(f"--log-to {tool}:{folder}: not written ({_line(err)})")

    def poll(self) -> None:
        """Write the points every rank recorded since the last call."""
        events: list[dict[str, Any]] = []
        for tail in self.tails:
            events.extend(tail.read_new())
        events.sort(key=lambda e: (e["time"], e["rank"]))
        try:
            points = event_points(events, self.names)
        except UsageError as err:  # (names no tool can take: neither can an export after the run)
            for writer in list(self.writers):
                self._drop(writer, err, export_after=False)
            return
        self.step = max([self.step, *(p.step for p in points if not p.tag.startswith("allreduce/"))])
        self._each("write", lambda w: w.write(points))

    def close(self, final: RunRecord) -> None:
        """The last points, the summary at the last step, the run's final state; then each
        tool's own clean-up."""
        self.poll()
        events = read_run_events(final.run_dir)
        marks = fault_points(final, events)
        if marks:
            self._each("write", lambda w: w.write(marks))
        summary = summary_values(final, summarize(events), events)
        self._each("finish", lambda w: w.finish(summary, self.step, final.state,
                                                 final.finished_at or time.time()))
        for tool in sorted({w.tool for w in self.writers}):
            try:
                shut_down(tool)
            except Exception as err:
                self.say(f"--log-to {tool}: {_line(err)}")
        for writer in self.writers:
            self.say(f"Logged to {writer.tool}: {writer.location}")

    def _each(self, what: str, action: Callable[[Writer], None]) -> None:
        for writer in list(self.writers):
            try:
                action(writer)
            except Exception as err:
                self._drop(writer, err)

    def _drop(self, writer: Writer, err: Exception, *, export_after: bool = True) -> None:
        """Stop writing to ``writer``, what it wrote removed; ``export_after``: say how to export
        the run after it ends."""
        self.writers.remove(writer)
        try:
            writer.discard()
        except Exception:  # reported below: the writer is dropped either way
            pass
        after = (f"; after the run: mlbench export {self.record.id} --to {writer.tool} {writer.out_dir}"
                 if export_after else "")
        self.say(f"--log-to {writer.tool}: stopped ({_line(err)}){after}")


def _line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]


__all__ = ["LiveExport", "Point", "Target", "parse_targets"]
