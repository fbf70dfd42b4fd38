"""What faults and stragglers cost a run: goodput, work lost, time to detect and to recover, and
the per-rank step-time spread.

* **goodput** = productive training time / wall time (:func:`time_accounting`, docs/faults.md):

  - the *wall time* is the time the run held its workers: from the start of each of its starts
    (the first and every `mlbench resume`) to that start's end (now, while it runs), summed;
    the time between a stop and the resume that continues it is no one's;
  - the *training time* is the run's training clock at its end (the result's, else rank 0's
    latest ``train/time``); a restarted or resumed group continues the clock of its checkpoint,
    so it holds each step of the final trajectory once, and no evaluation;
  - the *productive time* is that training time less what it holds that trains nothing: the
    checkpoint writes on the final trajectory (rank 0's ``checkpoint`` events of steps before
    the checkpoint of every later restart or resume), the injected stalls on it (their ``for=``)
    and the time every rank stood in its collectives while a link was down;
  - *redone steps*: the steps computed and then thrown away, done again: each restart's steps
    past its checkpoint (``faults.restarts``) and, for each resume, the steps rank 0 had logged
    past the checkpoint it resumed from.
* **faults**: the applied faults of run.json's ``faults`` section (:mod:`mlbench.launch.injector`)
  with, for each, seconds to detect (from the fault to the supervisor's verdict), to recover (from
  the verdict to the restarted group's first step) and the steps lost (done after the newest
  complete checkpoint, and so done again).
* **stragglers**: each rank's busy seconds per step (its compute phases, plus what an injected
  slowdown slept: ``fault/slowed``), the slowest rank, the spread (slowest / median) and how long
  the other ranks waited for it on average (their communication time beyond the slowest's, which
  waits for nobody). Needs the phase timing (not ``--no-timing``).
* **link down**: how long every rank stood in its collectives while an injected link-down cut a
  rank off (:func:`link_down_blocked`), which no rank's lead over the others shows.

`status RUN` (table and ``-o json``), the dashboard's run page and `compare` read these from
here, so they say the same.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from mlbench.results.events import events_path, parse_lines, read_rank_events, read_run_events
from mlbench.results.outcome import AllreduceResult, read_result
from mlbench.results.faults import LINK_DOWN, SLOW, STALL, policy_text, worker_sizes, workers_label
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary
from mlbench.run_config import RunDocument

#: The run.json section written by the supervisor (:mod:`mlbench.launch.injector`).
FAULTS_SECTION = "faults"
#: A rank this many times slower per step than the median is named a straggler in `status`.
STRAGGLER_SPREAD = 1.5


def run_starts(record: RunRecord, document: RunDocument | None) -> list[tuple[float, float]]:
    """(start, end) of each start of the run: those its resumes ended, then the current one."""
    spans = []
    for resume in (document.resumes if document is not None else []):
        ended = resume.get("ended_start") or {}
        begin, end = ended.get("started_at"), ended.get("finished_at")
        if isinstance(begin, (int, float)) and isinstance(end, (int, float)) and end >= begin:
            spans.append((float(begin), float(end)))
    if record.started_at is not None:
        end = record.finished_at if record.finished_at is not None else time.time()
        spans.append((record.started_at, max(record.started_at, end)))
    return spans


def _thrown_away(at: float, step: int, again: list[tuple[float, int]]) -> bool:
    """Whether what happened at wall time ``at``, at step ``step``, was thrown away: a later
    start (a restart or a resume at ``again``'s time) went on from a checkpoint at or before it."""
    return any(when > at and from_step <= step for when, from_step in again)


def _final_trajectory(events: Iterable[dict[str, Any]],
                      again: list[tuple[float, int]]) -> tuple[float | None, float, list[tuple[float, int]]]:
    """From rank 0's events: its training clock at the end, the seconds of its checkpoint writes
    on the final trajectory, and (wall time, step) of each logged step, for placing a fault.
    ``again``: (when, from step) of every restart and resume. A checkpoint written at or past the
    step a later start went on from is not in the clock it goes on with: it belongs to the work
    thrown away, or it is that start's own checkpoint, whose write came after its state (and
    clock) was taken."""
    clock = None
    checkpoint_s = 0.0
    logged: list[tuple[float, int]] = []
    for event in events:
        name, value, step = event.get("name"), event.get("value"), int(event.get("step") or 0)
        at = float(event.get("time") or 0.0)
        if name == "train/steps":
            logged.append((at, step))
        elif name == "train/time" and isinstance(value, (int, float)):
            clock = float(value)
        elif (name == "checkpoint" and isinstance(value, dict) and isinstance(value.get("seconds"), (int, float))
              and not _thrown_away(at, int(value.get("step", step)), again)):
            checkpoint_s += float(value["seconds"])
    return clock, checkpoint_s, logged


def struck_step(at: float, logged: list[tuple[float, int]]) -> int:
    """The step a fault at wall time ``at`` struck: the first after the last one logged before it."""
    before = [step for t, step in logged if t <= at]
    return (before[-1] if before else 0) + 1


def _logged_steps_before(run_dir: Path, offsets: list[int]) -> list[int]:
    """For each byte offset of rank 0's events file, the furthest step logged before it."""
    try:
        raw = events_path(run_dir, 0).read_bytes()
    except OSError:
        return [0 for _ in offsets]
    reached = []
    for offset in offsets:
        text = raw[:offset].decode("utf-8", errors="replace")
        steps = [int(e.get("step") or 0) for e in parse_lines(text[:text.rfind("\n") + 1].splitlines())
                 if e.get("name") == "train/steps"]
        reached.append(max(steps, default=0))
    return reached


def time_accounting(record: RunRecord, document: RunDocument | None, rank0: list[dict[str, Any]],
                    applied: list[dict[str, Any]], link_down: dict[str, Any] | None,
                    restarts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's time, split as the module says: ``wall_s``, ``train_s``, ``checkpoint_s``,
    ``stalled_s``, ``link_down_s``, ``productive_s``, ``goodput``, ``redone_steps`` (None before
    it trained)."""
    spans = run_starts(record, document)
    resumes = document.resumes if document is not None else []
    again = [(float(r["at"]), int(r.get("from_step") or 0)) for r in [*restarts, *resumes]
             if isinstance(r.get("at"), (int, float))]
    clock, checkpoint_s, logged = _final_trajectory(rank0, again)
    train = (record.result or {}).get("train_time")
    train_s = float(train) if isinstance(train, (int, float)) else clock
    wall_s = sum(end - begin for begin, end in spans)
    if not train_s or wall_s <= 0:
        return None
    stalled_s = sum(float(e.get("for") or 0.0) for e in applied
                    if e.get("kind") == STALL and not e.get("missed") and isinstance(e.get("time"), (int, float))
                    and not _thrown_away(float(e["time"]), struck_step(float(e["time"]), logged), again))
    link_down_s = float(link_down["blocked_s"]) if link_down else 0.0
    productive_s = max(0.0, train_s - checkpoint_s - stalled_s - link_down_s)
    offsets = [int(r.get("events_from") or 0) for r in resumes]
    redone = sum(int(r.get("lost_steps") or 0) for r in restarts)
    redone += sum(max(0, reached - int(r.get("from_step") or 0))
                  for r, reached in zip(resumes, _logged_steps_before(record.run_dir, offsets)))
    return {"wall_s": round(wall_s, 3), "train_s": round(train_s, 3), "checkpoint_s": round(checkpoint_s, 3),
            "stalled_s": round(stalled_s, 3), "link_down_s": round(link_down_s, 3),
            "productive_s": round(productive_s, 3), "goodput": min(1.0, productive_s / wall_s),
            "redone_steps": redone, "starts": len(spans)}


def stragglers(summary: RunSummary, events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Per-rank busy seconds per step, the slowest rank, the spread and the wait it caused; None
    for a run of one rank or without phase timing."""
    if len(summary.ranks) < 2 or not summary.steps:
        return None
    slowed: dict[int, float] = defaultdict(float)
    for event in events:
        if event.get("name") == "fault/slowed" and isinstance(event.get("value"), (int, float)):
            slowed[int(event.get("rank", 0))] += float(event["value"])
    busy = {r: summary.compute_seconds(r) + slowed[r] for r in summary.ranks}
    if not all(busy.values()):
        return None
    per_step = {r: busy[r] / summary.steps for r in summary.ranks}
    slowest = max(per_step, key=lambda r: per_step[r])
    median = statistics.median(per_step.values())
    others = [r for r in summary.ranks if r != slowest]
    waited = statistics.mean(max(0.0, summary.communication_seconds(r) - summary.communication_seconds(slowest))
                             for r in others)
    return {"step_s": [per_step[r] for r in summary.ranks], "ranks": list(summary.ranks),
            "slowest_rank": slowest, "spread": per_step[slowest] / median if median > 0 else None,
            "waited_s": waited}


def link_down_blocked(applied: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """How long training stood still while a rank's emulated link was down (``--inject
    link-down``): every collective waits for the rank that cannot be reached, so the wait shows
    in *every* rank's communication time and not as one rank slower than the others (which the
    straggler figures measure); and it may outlast the link's ``down_s``, as TCP retransmits only
    after its backed-off timeout. Measured per rank from the logging intervals (``time/communication``,
    ``time/eval`` and ``train/steps``, recorded at each interval's end) that overlap an outage:
    their communication time beyond their steps at the rank's median communication per step of
    the other intervals, plus, when an evaluation was under way (its all-reduce of the metrics
    waits too), its time beyond the median evaluation of the other intervals that evaluated;
    averaged over the ranks. None when no link went down or nothing overlaps."""
    downs = [e for e in applied if e.get("kind") == LINK_DOWN and not e.get("missed")
             and isinstance(e.get("down_s"), (int, float)) and isinstance(e.get("time"), (int, float))]
    if not downs:
        return None
    outages = [(float(e["time"]), float(e["time"]) + float(e["down_s"])) for e in downs]
    # (rank, step) -> [wall time of the record, communication seconds, steps, evaluation seconds]
    fields = {"time/communication": 1, "train/steps": 2, "time/eval": 3}
    intervals: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for event in events:
        name = event.get("name")
        if name not in fields or not isinstance(event.get("value"), (int, float)):
            continue
        interval = intervals[int(event.get("rank", 0)), int(event.get("step", 0))]
        interval[0] = max(interval[0], float(event.get("time") or 0.0))
        interval[fields[name]] = float(event["value"])
    blocked: dict[int, float] = {}
    for rank in sorted({r for r, _ in intervals}):
        usual: list[float] = []                  # communication seconds per step, outside the outages
        usual_eval: list[float] = []             # seconds of an evaluation, outside the outages
        during: list[tuple[float, float, float]] = []   # (communication s, steps, evaluation s) in one
        start = 0.0                              # an interval runs from the previous record to its own
        for _, (end, comm, steps, evaluation) in sorted((step, v) for (r, step), v in intervals.items()
                                                        if r == rank and v[2] > 0):
            if any(start < out_end and end > out_start for out_start, out_end in outages):
                during.append((comm, steps, evaluation))
            else:
                usual.append(comm / steps)
                if evaluation > 0:
                    usual_eval.append(evaluation)
            start = end
        if usual and during:
            per_step = statistics.median(usual)
            per_eval = statistics.median(usual_eval) if usual_eval else 0.0
            blocked[rank] = sum(max(0.0, comm - steps * per_step)
                                + (max(0.0, evaluation - per_eval) if evaluation else 0.0)
                                for comm, steps, evaluation in during)
    if not blocked:
        return None
    return {"down_s": round(sum(end - start for start, end in outages), 3),
            "blocked_s": round(statistics.mean(blocked.values()), 3),
            "ranks": sorted({int(e.get("rank", 0)) for e in downs})}


def run_faults(record: RunRecord, summary: RunSummary,
               events: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The measurements of one run, as `status -o json` shows them under ``faults``:
    ``injected`` (the --inject schedules), ``on_failure``, ``events`` (each applied fault),
    ``count``, ``restarts`` (``restarts_not_counted``: of them, those that did not count against
    ``restart:N``), ``lost_steps``, ``detect_s``/``recover_s`` (per fault dealt with),
    ``goodput`` and ``stragglers``. ``events``: the run's metric events, read here when None
    and a slowdown was injected (only then do they add to the summary)."""
    document = RunDocument.load_or_none(record.run_dir)
    config = document.config if document is not None else None
    if events is None:
        timed = config is not None and any(f.get("kind") in (SLOW, LINK_DOWN) for f in config.faults)
        events = (read_run_events(record.run_dir) if timed
                  else read_rank_events(events_path(record.run_dir, 0)))
    rank0 = [e for e in events if int(e.get("rank", 0)) == 0]
    section = (document.extra.get(FAULTS_SECTION) if document is not None else None) or {}
    applied = [dict(e) for e in section.get("events") or [] if isinstance(e, dict)]
    restarts = [dict(r) for r in section.get("restarts") or [] if isinstance(r, dict)]
    policy = None
    if config is not None:
        policy = policy_text(config.on_failure, config.max_restarts)
    link_down = link_down_blocked(applied, events)
    # task 0a's sweep trains nothing: no goodput to speak of (its result's time is the sweep's)
    swept = isinstance(read_result(record.result), AllreduceResult)
    accounting = None if swept else time_accounting(record, document, rank0, applied, link_down, restarts)
    return {
        "injected": [f.get("text") for f in (config.faults if config is not None else [])],
        "on_failure": policy,
        "events": applied,
        "count": sum(1 for e in applied if not e.get("missed")),
        "restarts": len(restarts),
        "restarts_not_counted": sum(1 for r in restarts if r.get("counted") is False),
        "workers": worker_sizes(record.workers, restarts),
        "lost_steps": accounting["redone_steps"] if accounting else sum(int(r.get("lost_steps") or 0)
                                                                        for r in restarts),
        "detect_s": [e["detected_s"] for e in applied if e.get("detected_s") is not None],
        "recover_s": [r["recovered_s"] for r in restarts if r.get("recovered_s") is not None],
        "goodput": accounting["goodput"] if accounting else None,
        "time": accounting,
        "stragglers": stragglers(summary, events),
        "link_down": link_down,
    }


#: The parts of :func:`time_accounting` that add up over repeats, and the restarts' recovery.
SUMMED = ("wall_s", "train_s", "checkpoint_s", "stalled_s", "link_down_s", "productive_s", "redone_steps")


def summed_over_repeats(runs: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """What the faults of several repeats cost together, from each run's :func:`run_faults`:
    the sums of :data:`SUMMED`, ``recovery_s`` (every restart's time to recover), ``restarts``
    and ``runs``, and ``goodput`` as the summed productive time over the summed wall time (each
    second of every repeat weighs the same, where the median of the goodputs weighs each run
    alike). None when no run trained."""
    accounted = [(faults, faults["time"]) for faults in runs if faults.get("time")]
    if not accounted:
        return None
    totals: dict[str, Any] = {key: round(sum(float(t.get(key) or 0.0) for _, t in accounted), 3) for key in SUMMED}
    totals["redone_steps"] = int(totals["redone_steps"])
    totals["recovery_s"] = round(sum(sum(f.get("recover_s") or []) for f, _ in accounted), 3)
    totals["restarts"] = sum(int(f.get("restarts") or 0) for f, _ in accounted)
    totals["runs"] = len(accounted)
    totals["goodput"] = totals["productive_s"] / totals["wall_s"] if totals["wall_s"] > 0 else None
    return totals


def run_worker_sizes(record: RunRecord, run_json: dict[str, Any] | None = None) -> list[int]:
    """The sizes the run's group trained at: the store's (the size it started at), then each
    ``--on-failure shrink``'s (run.json's ``faults.restarts``; ``run_json`` when already read)."""
    if run_json is None:
        document = RunDocument.load_or_none(record.run_dir)
        section = (document.extra.get(FAULTS_SECTION) if document is not None else None) or {}
    else:
        section = run_json.get(FAULTS_SECTION) or {}
    restarts = section.get("restarts") if isinstance(section, dict) else None
    return worker_sizes(record.workers, [r for r in restarts or [] if isinstance(r, dict)])


def run_restarts(record: RunRecord) -> int:
    """How often the run's group started again after a failure (restarts and shrinks)."""
    document = RunDocument.load_or_none(record.run_dir)
    section = (document.extra.get(FAULTS_SECTION) if document is not None else None) or {}
    restarts = section.get("restarts") if isinstance(section, dict) else None
    return len([r for r in restarts or [] if isinstance(r, dict)])


def run_workers_label(record: RunRecord, run_json: dict[str, Any] | None = None) -> str:
    """``4``, or ``4 -> 3`` for a run that shrank: the workers column of every surface."""
    return workers_label(run_worker_sizes(record, run_json))


def fault_setting(faults: dict[str, Any]) -> str:
    """What a run was put through, from :func:`run_faults`: its ``--inject`` schedules and its
    ``--on-failure`` policy, as compare's family key and heading ("" for a run with neither, the
    default). Runs under different schedules or policies measure different things, so they never
    share a family; the text is the options as given, so repeats of one setting share it."""
    injected = [str(text) for text in faults.get("injected") or []]
    policy = faults.get("on_failure")
    if not injected and policy in (None, "fail"):
        return ""
    schedule = f"inject {' + '.join(injected)}" if injected else "no faults injected"
    return f"{schedule}; on failure {policy or 'fail'}"


def had_faults(faults: dict[str, Any]) -> bool:
    """Whether a run was put through faults or recovered from a failure (any injected schedule
    or restart): then compare shows the goodput columns."""
    return bool(faults.get("injected") or faults.get("restarts"))


def recoveries(faults: dict[str, Any]) -> str:
    """'1 restart', '2 restarts', '1 shrink' (``--on-failure shrink``: each went on with fewer
    workers): how often the group started again, named by the policy that did it."""
    count = faults.get("restarts") or 0
    what = "shrink" if str(faults.get("on_failure") or "").startswith("shrink") else "restart"
    return f"{count:g} {what}{'' if count == 1 else 's'}"


def describe_faults(faults: dict[str, Any]) -> list[tuple[str, str]]:
    """The `status RUN` rows (label, text) of :func:`run_faults`: the faults and what they cost
    when any were injected or the run restarted, the goodput of a run that trained, and the
    straggler when one rank is clearly the slowest."""
    rows: list[tuple[str, str]] = []
    if faults["injected"] or faults["restarts"]:
        kinds = ", ".join(f"{e.get('kind')} of rank {e.get('rank')} at {float(e.get('at') or 0):.1f} s"
                          + (" (missed)" if e.get("missed") else "") for e in faults["events"])
        rows.append(("faults", f"{faults['count']} ({kinds or 'none applied yet'}); on failure: "
                               f"{faults['on_failure']}"))
        detect = _seconds(faults["detect_s"])
        recover = _seconds(faults["recover_s"])
        free = faults.get("restarts_not_counted") or 0
        besides = f" ({free} after injected faults, not counted against {faults['on_failure']})" if free else ""
        rows.append(("recovery", f"{recoveries(faults)}{besides}, {faults['lost_steps']} steps lost and redone; "
                                 f"detected in {detect}, recovered in {recover}"))
    if faults["goodput"] is not None:
        rows.append(("goodput", goodput_text(faults["time"])))
    spread = faults["stragglers"]
    if spread is not None and spread["spread"] is not None and (spread["spread"] >= STRAGGLER_SPREAD
                                                                 or faults["injected"]):
        per_step = ", ".join(f"{1000 * s:.2f}" for s in spread["step_s"])
        rows.append(("stragglers", f"rank {spread['slowest_rank']} slowest, {spread['spread']:.2f}x the median "
                                   f"busy step; others waited {spread['waited_s']:.2f} s for it "
                                   f"(ms per step by rank: {per_step})"))
    down = faults.get("link_down")
    if down is not None:
        ranks = ", ".join(str(r) for r in down["ranks"])
        rows.append(("link down", f"every rank waited {down['blocked_s']:.2f} s in its collectives for the link of "
                                  f"rank {ranks} (down {down['down_s']:.2f} s)"))
    return rows


def goodput_text(accounting: dict[str, Any]) -> str:
    """The goodput row: the share, then what the wall time held besides productive training."""
    starts = accounting.get("starts", 1)
    over = f" over {starts} starts" if starts > 1 else ""
    apart = [f"{name} {accounting[key]:.1f} s" for name, key in (("checkpoints", "checkpoint_s"),
                                                                 ("stalls", "stalled_s"),
                                                                 ("link down", "link_down_s")) if accounting[key]]
    besides = f"; training time {accounting['train_s']:.1f} s less {', '.join(apart)}" if apart else ""
    return (f"{100 * accounting['goodput']:.1f}% (productive training {accounting['productive_s']:.1f} s of "
            f"{accounting['wall_s']:.1f} s wall{over}{besides})")


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.1f} s" for v in values) if values else "-"
