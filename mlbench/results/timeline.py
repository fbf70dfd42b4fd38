"""A run's faults, restarts and resumes in the order they happened, with the errors each failure
left behind.

`status RUN` shows it under "Faults and recovery" (and ``-o json`` as ``timeline``), the
dashboard's run page lists it and marks it on the curves. An error a worker recorded belongs to
the group it ran in: one that ended before a restart's new group started (or before a resume)
is that failure's, shown under it; the errors of the group that ran last are the run's own
"Errors". So the peer's "Connection closed by peer" of a kill that the run recovered from is
shown under the kill's restart, not as an error of a run that finished.

Times are seconds of wall time from the run's first start (the origin of goodput's wall time,
:mod:`mlbench.results.goodput`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mlbench.results.events import read_run_events
from mlbench.results.faults import describe_fault
from mlbench.results.goodput import FAULTS_SECTION, run_starts, struck_step
from mlbench.results.store import RunRecord
from mlbench.run_config import RunDocument

#: Where a restart entry has no ``started_at`` (recorded before it was), its new group is taken to
#: have started this long after the failure.
_START_GUESS_S = 2.0
#: An error line is cut to this many characters in the timeline (the whole line is in the log).
ERROR_CHARS = 200

FAULT, MISSED, RESTART, SHRINK, RESUME = "fault", "missed", "restart", "shrink", "resume"


@dataclass
class Moment:
    """One thing that happened to the run: ``at`` seconds after its first start."""

    at: float
    kind: str          # fault, missed, restart, shrink or resume
    text: str
    #: the training step it is drawn at on the curves: a fault's, the step it struck (the one after
    #: the last rank 0 logged before it); a restart's, shrink's or resume's, the step it went on from
    step: int | None = None
    errors: list[str] = field(default_factory=list)   # the errors of the group this moment ended


@dataclass
class Timeline:
    origin: float | None            # unix time of the run's first start
    moments: list[Moment]
    errors: list[str]               # the errors of the group that ran last

    def to_dict(self) -> dict[str, Any]:
        return {"origin": self.origin, "moments": [asdict(m) for m in self.moments], "errors": list(self.errors)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fault_text(event: dict[str, Any]) -> tuple[str, str]:
    what = describe_fault(event)
    if event.get("missed"):
        return MISSED, f"missed: {what} ({event['missed']})"
    details = [f"detected in {event['detected_s']:.1f} s" if _number(event.get("detected_s")) else None,
               f"action {event['action']}" if event.get("action") else None]
    shown = ", ".join(d for d in details if d)
    return FAULT, f"{what}{f' ({shown})' if shown else ''}"


def _restart_text(number: int, entry: dict[str, Any]) -> tuple[str, str]:
    kind = SHRINK if entry.get("survivors") is not None else RESTART
    ranks = entry.get("ranks")
    who = f" of rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""
    lost = int(entry.get("lost_steps") or 0)
    parts = [f"{kind} {number}{who} from step {entry.get('from_step', 0)}",
             f"{lost} step{'s' if lost != 1 else ''} redone"]
    if entry.get("survivors") is not None:
        parts.append(f"{entry.get('workers')} worker(s) go on (old ranks {', '.join(map(str, entry['survivors']))})")
    if _number(entry.get("backoff_s")) and entry["backoff_s"] > 0:
        parts.append(f"backed off {entry['backoff_s']:g} s")
    parts.append(f"back in {entry['recovered_s']:.1f} s" if _number(entry.get("recovered_s"))
                 else "never back")
    return kind, ", ".join(parts)


def run_timeline(record: RunRecord, document: RunDocument | None = None,
                 events: list[dict[str, Any]] | None = None) -> Timeline:
    """The :class:`Timeline` of a run from run.json (``faults``, ``resumes``) and its events
    (``events``: every rank's, when already read)."""
    document = document if document is not None else RunDocument.load_or_none(record.run_dir)
    origin = min((begin for begin, _ in run_starts(record, document)), default=None)
    every = events if events is not None else read_run_events(record.run_dir)
    logged = [(float(e["time"]), int(e.get("step") or 0)) for e in every
              if e.get("name") == "train/steps" and e.get("rank", 0) == 0 and _number(e.get("time"))]

    section = (document.extra.get(FAULTS_SECTION) if document is not None else None) or {}
    happened: list[tuple[float, Moment, float | None]] = []   # (unix time, moment, when its next group started)
    for event in section.get("events") or []:
        if isinstance(event, dict) and _number(event.get("time")) and event.get("kind"):
            kind, text = _fault_text(event)
            struck_at = float(event["time"])
            happened.append((struck_at, Moment(0.0, kind, text, struck_step(struck_at, logged)), None))
    for number, entry in enumerate(section.get("restarts") or [], 1):
        if isinstance(entry, dict) and _number(entry.get("at")):
            kind, text = _restart_text(number, entry)
            started = float(entry["started_at"]) if _number(entry.get("started_at")) \
                else float(entry["at"]) + float(entry.get("backoff_s") or 0.0) + _START_GUESS_S
            happened.append((float(entry["at"]), Moment(0.0, kind, text, int(entry.get("from_step") or 0)), started))
    for resume in document.resumes if document is not None else []:
        if _number(resume.get("at")):
            after = f" (after {resume['after']})" if resume.get("after") else ""
            text = f"resume from step {resume.get('from_step') or 0}{after}"
            happened.append((float(resume["at"]), Moment(0.0, RESUME, text, int(resume.get("from_step") or 0)),
                             float(resume["at"])))
    happened.sort(key=lambda h: h[0])
    if origin is None:
        origin = happened[0][0] if happened else None
    for happened_at, moment, _ in happened:
        moment.at = round(happened_at - (origin or happened_at), 3)
    ends = [(started, moment) for _, moment, started in happened if started is not None]
    errors: list[str] = []
    for event in every:
        if event.get("name") != "error":
            continue
        line = f"worker {event.get('rank')}: {event.get('value')}"
        when = float(event["time"]) if _number(event.get("time")) else None
        ended = next((moment for started, moment in ends if when is not None and when < started), None)
        if ended is None:
            errors.append(line)
        else:   # one line under its failure; the whole of it is in the worker's log
            ended.errors.append(line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 3] + "...")
    return Timeline(origin, [moment for _, moment, _ in happened], errors)


def timeline_lines(timeline: Timeline) -> list[str]:
    """The timeline as `status RUN` prints it: ``+4.0s  kill of rank 1 ...``, each failure's
    errors indented under it."""
    lines = []
    for moment in timeline.moments:
        lines.append(f"  {f'+{moment.at:.1f}s':>9}  {moment.text}")
        lines.extend(f"             {error}" for error in moment.errors)
    return lines
