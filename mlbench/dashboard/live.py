"""Live updates: one watcher tails the run store and pushes what changed to every open page.

Pages do not poll: each holds one server-sent-event stream (``/api/stream``). A single task of the
server looks at the run store once per ``interval`` while any page is connected, reads only
what the runs' event and log files gained since the last look (whole lines, byte offsets:
:func:`mlbench.results.events.read_events_from`), and sends each page the rows of the runs
table that changed, or, for a run's page, the new points of its curves and its workers' new log
output. Summaries are made by :func:`mlbench.results.summary.summarize`, as for `status`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.dashboard import views
from mlbench.dashboard.sources import Source, Sources
from mlbench.errors import MlbenchError, RunNotFound
from mlbench.results.events import read_events_from, read_run_events
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary, summarize
from mlbench.results.timeline import run_timeline

log = logging.getLogger("mlbench.dashboard")

LOG_TAIL_BYTES = 64 * 1024       # what a page first sees of a long log
LOG_CHUNK_BYTES = 256 * 1024     # the most one update carries per log
MAX_QUEUED_BYTES = 2 * 1024 * 1024  # what a page may leave unread before it is dropped
Message = tuple[str, dict[str, Any]]


def clean(value: Any) -> Any:
    """JSON has no NaN or infinity (a diverged loss, a statistic of runs that missed the goal)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(clean(value), separators=(",", ":"), default=str)


def sse(message: Message) -> str:
    """A message as a server-sent event."""
    kind, data = message
    return f"event: {kind}\ndata: {dumps(data)}\n\n"


class RunEvents:
    """A run's events read so far; :meth:`refresh` adds what its files gained since."""

    def __init__(self, run_dir: Path):
        self.folder = Path(run_dir) / "events"
        self.offsets: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
        self.version = 0
        self._summary: tuple[int, RunSummary] | None = None

    def refresh(self) -> bool:
        new: list[dict[str, Any]] = []
        for path in sorted(self.folder.glob("rank-*.jsonl")):
            events, self.offsets[path.name] = read_events_from(path, self.offsets.get(path.name, 0))
            new += events
        if new:
            self.events += new
            # the order read_run_events gives: by time, then rank (sort is stable)
            self.events.sort(key=lambda e: (e.get("time", 0), e.get("rank", 0)))
            self.version += 1
        return bool(new)

    def summary(self) -> RunSummary:
        if self._summary is None or self._summary[0] != self.version:
            self._summary = (self.version, summarize(self.events))
        return self._summary[1]


def _stamp(record: RunRecord) -> tuple:
    """What an ended run's row depends on besides its files, which no longer change."""
    return (record.state, record.finished_at, record.name, record.reason)


def read_log(path: Path, offset: int | None, limit: int = LOG_CHUNK_BYTES) -> tuple[str, int, int]:
    """(text, start, next offset) of a log from ``offset``; None: its last LOG_TAIL_BYTES."""
    try:
        size = path.stat().st_size
    except OSError:
        return "", 0, 0
    start = max(0, size - LOG_TAIL_BYTES) if offset is None else min(max(0, offset), size)
    with open(path, "rb") as f:
        f.seek(start)
        chunk = f.read(limit)
    return chunk.decode("utf-8", errors="replace"), start, start + len(chunk)


def run_document(source: Source, record: RunRecord, events: list[dict[str, Any]],
                 summary: RunSummary) -> dict[str, Any]:
    """Everything a run's page shows."""
    run_json = views.read_run_json(record)
    return {"run": views.run_row(source.key, record, summary, run_json),
            "spec": views.run_spec(record, run_json, summary),
            "summary": views.run_summary(record, summary),
            "result": views.result_sentence(record, summary),
            "system": views.run_system(summary),
            "series": views.run_series(record, events, summary),
            "timeline": run_timeline(record, events=events).to_dict(),
            "sweep": views.run_sweep(record),
            "logs": views.log_names(record)}


@dataclass(eq=False)
class Subscriber:
    """One open page: what it wants, what it has been sent, and what waits to be sent.

    A page that does not read its stream (a stalled client, a frozen tab) must not make the
    dashboard buffer for it without end: while it has messages waiting it is sent nothing new
    (:meth:`Hub._ready`), and should one look's messages exceed :data:`MAX_QUEUED_BYTES` (a run
    with many growing logs) its queue is emptied and ends with ``None``, which ends its stream;
    a browser reconnects and starts afresh (``retry:``).
    """

    runs: bool = False
    run_id: str | None = None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    queued_bytes: int = 0
    dropped: bool = False
    fresh: bool = True
    version: int = -1
    state: tuple = ()
    sent: dict[str, int] = field(default_factory=dict)
    log_offsets: dict[str, int] = field(default_factory=dict)

    def offer(self, text: str) -> bool:
        """Queue ``text`` (on the event loop); False when the page is dropped instead."""
        if self.dropped:
            return False
        if self.queued_bytes + len(text) > MAX_QUEUED_BYTES:
            self.dropped = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queued_bytes = 0
            self.queue.put_nowait(None)
            return False
        self.queued_bytes += len(text)
        self.queue.put_nowait(text)
        return True

    async def next(self, timeout: float) -> str | None:
        """The next event's text; None: the stream is over (dropped). TimeoutError: none came."""
        text = await asyncio.wait_for(self.queue.get(), timeout)
        if text is not None:
            self.queued_bytes -= len(text)
        return text


class Hub:
    """The one watcher of the run store and the pages it feeds."""

    def __init__(self, sources: Sources, interval: float = 1.0):
        self.sources = sources
        self.interval = interval
        self.subscribers: set[Subscriber] = set()
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        #: where each run stood at the last look: an active run's row, an ended run's stamp;
        #: None before the first look
        self._stamps: dict[tuple[str, str], Any] | None = None
        self._ended: dict[tuple[str, str], tuple[tuple, dict[str, Any]]] = {}
        self._live: dict[tuple[str, str], RunEvents] = {}

    # -- the pages ----------------------------------------------------------------------------
    def subscribe(self, runs: bool, run_id: str | None) -> Subscriber:
        sub = Subscriber(runs=runs, run_id=run_id)
        self.subscribers.add(sub)
        if self._wake is not None:
            self._wake.set()  # a new page gets its first picture now, not at the next tick
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    async def run(self) -> None:
        """Look at the store every ``interval`` seconds while any page is open."""
        self._wake = asyncio.Event()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            subs = [sub for sub in self.subscribers if self._ready(sub)]
            if not subs:
                continue
            try:
                messages = await asyncio.to_thread(self.tick_text, subs)
            except Exception:  # a bad run folder must not stop the updates of the others
                log.exception("dashboard update failed")
                continue
            for sub, text in messages:
                if not sub.offer(text):
                    self.unsubscribe(sub)

    @staticmethod
    def _ready(sub: Subscriber) -> bool:
        """Whether a page has taken what it was sent: one that has not gets nothing new this
        time (its cursors wait, so nothing is lost and nothing piles up); a runs table that
        skipped changes gets all its rows afresh when it is ready again."""
        if sub.queued_bytes == 0:
            return True
        if sub.runs:
            sub.fresh = True
        return False

    def tick_text(self, subs: list[Subscriber]) -> list[tuple[Subscriber, str]]:
        """:meth:`tick`, its messages as server-sent events (made in the worker thread)."""
        texts: dict[int, str] = {}  # a message shared by pages is encoded once
        return [(sub, texts.get(id(message)) or texts.setdefault(id(message), sse(message)))
                for sub, message in self.tick(subs)]

    # -- the runs table -----------------------------------------------------------------------
    def row(self, source: Source, record: RunRecord) -> dict[str, Any]:
        """A run's row of the runs table. An ended run's is made once (its events read and
        summarised) and kept while its state, end, name and reason stay; an active run's from
        what its event files gained since the last look."""
        key = (source.key, record.id)
        if record.active:
            events = self._live.setdefault(key, RunEvents(record.run_dir))
            events.refresh()
            return views.run_row(source.key, record, events.summary(), views.read_run_json(record))
        stamp = _stamp(record)
        cached = self._ended.get(key)
        if cached is None or cached[0] != stamp:
            summary = summarize(read_run_events(record.run_dir))
            cached = (stamp, views.run_row(source.key, record, summary, views.read_run_json(record)))
            self._ended[key] = cached
        return cached[1]

    def page(self, limit: int, before: tuple[float, str] | None = None,
             words: tuple[str, ...] = ()) -> dict[str, Any]:
        """One page of the runs table (also the API's list): up to ``limit`` rows, newest first,
        of the runs created before ``before`` that hold ``words`` (:meth:`Sources.page`), the
        cursor of the next page (None: this is the last), how many runs there are and how many
        hold the words. Only the rows of the page are made."""
        found = self.sources.page(limit, before, words)
        with self._lock:
            rows = [self.row(source, record) for source, record in found.records]
        last = found.records[-1][1] if found.records and found.more else None
        return {"runs": rows, "next": f"{last.created_at!r}:{last.id}" if last else None,
                "total": found.total, "matching": found.matching, "sources": self._sources()}

    def _changes(self) -> tuple[list[dict[str, Any]], list[str], int]:
        """The rows that changed since the last look (new runs, active runs' progress, runs that
        ended or were renamed), the ids of runs gone, and how many runs there are. It reads the
        catalog (every run's state, not its files) and makes only the rows that changed; the
        first look only notes where every run stands."""
        stamps: dict[tuple[str, str], Any] = {}
        changed = []
        for source, record in self.sources.records():
            key = (source.key, record.id)
            row = self.row(source, record) if record.active else None
            stamps[key] = row if row is not None else _stamp(record)
            if self._stamps is not None and self._stamps.get(key) != stamps[key]:
                changed.append(row if row is not None else self.row(source, record))
        removed = [key[1] for key in self._stamps or {} if key not in stamps]
        self._stamps = stamps
        for key in set(self._ended) - set(stamps):
            del self._ended[key]
        return changed, removed, len(stamps)

    def _sources(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self.sources.all()]

    # -- one look at the store ----------------------------------------------------------------
    def tick(self, subs: list[Subscriber]) -> list[tuple[Subscriber, Message]]:
        with self._lock:
            out: list[tuple[Subscriber, Message]] = []
            if any(s.runs for s in subs):
                changed, removed, total = self._changes()
                for sub in (s for s in subs if s.runs):
                    if sub.fresh:  # the page (re)loads its pages from the API
                        out.append((sub, ("runs", {"reset": True, "rows": [], "removed": [], "total": total,
                                                   "sources": self._sources()})))
                    elif changed or removed:
                        out.append((sub, ("runs", {"rows": changed, "removed": removed, "total": total,
                                                   "sources": self._sources()})))
            watched = {s.run_id for s in subs if s.run_id}
            for run_id in watched:
                out += self._run_updates(run_id, [s for s in subs if s.run_id == run_id])
            live_keys = {key for key, stamp in (self._stamps or {}).items() if isinstance(stamp, dict)}
            for key in set(self._live) - live_keys - {k for k in self._live if k[1] in watched}:
                del self._live[key]
            for sub in subs:
                sub.fresh = False
            return out

    def _run_updates(self, run_id: str, subs: list[Subscriber]) -> list[tuple[Subscriber, Message]]:
        try:
            source, record = self.sources.find(run_id)
        except RunNotFound:
            return [(sub, ("gone", {"id": run_id})) for sub in subs]
        except MlbenchError as err:
            return [(sub, ("problem", {"error": str(err)})) for sub in subs]
        events = self._live.setdefault((source.key, record.id), RunEvents(record.run_dir))
        events.refresh()
        state = (record.state, record.reason, record.finished_at)
        document = None
        out: list[tuple[Subscriber, Message]] = []
        for sub in subs:
            if sub.fresh or sub.version != events.version or sub.state != state:
                document = document or run_document(source, record, events.events, events.summary())
                out.append((sub, ("run", self._run_message(sub, document))))
                sub.version, sub.state = events.version, state
        # pages at the same place of a log share one read and one message (and its text)
        logs: dict[tuple[str, int | None], tuple[Message, int]] = {}
        for sub in subs:
            for name in views.log_names(record):
                offset = sub.log_offsets.get(name)
                if (name, offset) not in logs:
                    text, start, end = read_log(record.run_dir / "logs" / name, offset)
                    logs[name, offset] = (("log", {"name": name, "text": text, "reset": offset is None,
                                                   "start": start}), end)
                message, end = logs[name, offset]
                if message[1]["text"] or offset is None:
                    out.append((sub, message))
                sub.log_offsets[name] = end
        return out

    @staticmethod
    def _run_message(sub: Subscriber, document: dict[str, Any]) -> dict[str, Any]:
        """The whole page the first time; then the series' new points (from the last one sent,
        which may have been completed since)."""
        series = document["series"]
        if sub.fresh:
            sub.sent = {name: len(points) for name, points in series.items()}
            return {"reset": True, **document}
        append = {}
        for name, points in series.items():
            start = min(max(0, sub.sent.get(name, 0) - 1), len(points))
            append[name] = {"from": start, "points": points[start:]}
            sub.sent[name] = len(points)
        message = {k: v for k, v in document.items() if k != "series"}
        message["append"] = append
        return message
