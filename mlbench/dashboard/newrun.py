"""The new-run form: the choices of `mlbench run`, checked by the code `mlbench run` uses.

The form's fields become a :class:`~mlbench.launch.plan.RunRequest` through the library's own
parsers (``parse_duration``, ``parse_overrides``); its runs are planned by `mlbench run`'s
planning (:func:`~mlbench.launch.session.plan_runs`) and validated and recorded by the launcher
the registry chooses for the store (``build_config``, ``check_optimizer``, the data check), so a
wrong value is refused with the sentence the CLI prints. The sentence is shown beside the field
it is about; one the form cannot place is shown above the form.

Several worker counts make several runs (one group id, as `mlbench run task1a 1 2 4`); they are
started one after another by :class:`RunQueue`, as the CLI runs them, so that they do not
compete for this machine's cores.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from mlbench.dashboard.sources import CLUSTER, LOCAL, Source, Sources
from mlbench.errors import DataError, MlbenchError, UsageError
from mlbench.results.store import CANCELLED, PENDING, RunRecord
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.overrides import parse_overrides
from mlbench.tasks.registry import TASKS, get_task
from mlbench.tasks.spec import AnySpec, TaskSpec

if TYPE_CHECKING:
    from mlbench.launch.plan import DataSource

#: Where a refusal belongs, by how its sentence begins (the CLI's sentences name their option).
_FIELD_OF = (
    ("unknown task", "task"), ("the number of workers", "workers"), ("invalid duration", "time_budget"),
    ("--set", "overrides"), ("unknown model", "overrides"), ("model ", "overrides"),
    ("--max-steps", "max_steps"), ("--seed", "seed"), ("--data-dir", "data_dir"), ("--data ", "data"),
    ("unknown optimizer", "optimizer"), ("optimizer ", "optimizer"), ("topology", "opt.topology"),
    ("ddp hook", "opt.hook"), ("--save-model", "form"),
)
_OPTION = re.compile(r"^option (\w+)[= ]")


class FormError(MlbenchError):
    """The form was refused: a sentence per field."""

    exit_code = 2

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


#: "100000 workers: this machine can start at most 32 (...)" (LocalLauncher.check_workers)
_WORKER_COUNT = re.compile(r"^\d+ workers: ")


def field_of(message: str) -> str:
    if _WORKER_COUNT.match(message):
        return "workers"
    match = _OPTION.match(message)
    if match:
        return f"opt.{match.group(1)}"
    for prefix, name in _FIELD_OF:
        if message.startswith(prefix):
            return name
    return "form"


def form_choices(sources: Sources) -> dict[str, Any]:
    """What the form offers: the tasks, the optimizers with their options, where to run."""
    from mlbench.optim.descriptors import describe_optimizers

    where = [{"key": LOCAL, "label": "this machine"}]
    if sources.cluster is not None:
        where.append({"key": CLUSTER, "label": sources.cluster.label})
    return {
        "tasks": [_task_choice(t) for t in TASKS.values()],
        "optimizers": describe_optimizers(),
        "where": where,
    }


def _task_choice(task: AnySpec) -> dict[str, Any]:
    """A task as the form shows it; the all-reduce benchmark has no data set and no goal."""
    if isinstance(task, TaskSpec):
        metric = get_metric(task.metric)
        return {"name": task.name, "title": task.title, "kind": task.kind, "dataset": task.settings.dataset,
                "goal_full": task.goal_full, "goal_light": task.goal_light, "metric": task.metric,
                "light_text": (f"{metric.describe_goal(task.goal_light)} instead of "
                               f"{metric.describe_goal(task.goal_full)}")}
    return {"name": task.name, "title": task.title, "kind": task.kind, "dataset": None,
            "goal_full": None, "goal_light": None, "metric": None, "light_text": None}


def _integer(text: Any, name: str, errors: dict[str, str]) -> int | None:
    text = str(text if text is not None else "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        errors.setdefault(name, f"{text!r} is not a valid integer")
        return None


def parse_form(form: dict[str, Any]) -> tuple[Any, list[int]]:
    """The request the form describes (its first worker count) and every worker count, or a
    FormError naming every field that is wrong."""
    from mlbench.launch.plan import RunRequest, parse_duration

    errors: dict[str, str] = {}

    def check(name: str, parse, *args):
        try:
            return parse(*args)
        except UsageError as err:
            errors.setdefault(name, str(err))
            return None

    task = str(form.get("task") or "")
    check("task", get_task, task)
    tokens = re.split(r"[\s,]+", str(form.get("workers") or "").strip())
    counts = [_integer(tok, "workers", errors) for tok in tokens if tok]
    if not counts and "workers" not in errors:
        errors["workers"] = "give one or more worker counts, e.g. 1 2 4"
    budget = str(form.get("time_budget") or "").strip()
    budget_s = check("time_budget", parse_duration, budget) if budget else None
    lines = [line.strip() for line in re.split(r"[\n;]+", str(form.get("overrides") or "")) if line.strip()]
    overrides = check("overrides", parse_overrides, lines) or {}
    max_steps = _integer(form.get("max_steps"), "max_steps", errors)
    seed = _integer(form.get("seed"), "seed", errors)
    given = form.get("options") or {}
    if not isinstance(given, dict):
        errors.setdefault("form", f"options {given!r}: send the optimizer's options as a JSON object "
                                  'of NAME: VALUE, e.g. {"rank": "2"}')
        given = {}
    options = {str(k): str(v).strip() for k, v in given.items() if str(v).strip()}
    if errors:
        raise FormError(errors)
    workers = [k for k in counts if k is not None]  # all of them: a count that is not is an error
    data_dir = str(form.get("data_dir") or "").strip() or None
    data = cast("DataSource", str(form.get("data") or "real"))  # checked by build_config, as the CLI's
    base = RunRequest(task=task, workers=workers[0], overrides=overrides, data=data,
                      data_dir=data_dir, light=bool(form.get("light")),
                      stop_at_goal=not form.get("no_stop"), time_budget_s=budget_s,
                      max_steps=max_steps, seed=seed or 0,
                      optimizer=str(form.get("optimizer") or "") or None,
                      optimizer_options=options)
    return base, workers


def _refused(err: MlbenchError) -> FormError:
    name = "data_dir" if isinstance(err, DataError) else field_of(str(err))
    return FormError({name: str(err)})


def _where(sources: Sources, where: Any) -> Source:
    """The store the form's ``where`` names: this machine, or the current cluster when there is
    one; anything else is refused (never run here instead)."""
    keys = [s.key for s in sources.all()]
    if where not in keys:
        places = " or ".join(repr(k) for k in keys)
        raise FormError({"where": f"where {where!r}: runs can be started on {places}"})
    try:
        return sources.by_key(where)
    except MlbenchError as err:  # the cluster's store cannot be opened now: the runs page says why
        raise FormError({"where": str(err)}) from None


def create_runs(sources: Sources, form: dict[str, Any]) -> tuple[Source, list[RunRecord]]:
    """Validate the form and record its runs (pending), planned and created as `mlbench run`
    plans and creates them (the same planning, the launcher the registry chooses for the
    store); nothing is recorded when one is wrong."""
    from mlbench.launch.plan import build_config
    from mlbench.launch.registry import choose
    from mlbench.launch.session import plan_runs
    from mlbench.optim.descriptors import check_optimizer

    base, counts = parse_form(form)
    source = _where(sources, form.get("where") or LOCAL)
    try:
        launcher = choose(source.open_store(), {})
        plan = plan_runs(base, counts)
        for workers in sorted({r.workers for r in plan.requests}, reverse=True):
            launcher.check_workers(workers)
        for request in plan.requests:  # every run checked before the first is recorded
            config, _ = build_config(request)
            check_optimizer(config.optimizer, request.optimizer_options, request.workers)
        return source, [launcher.create(request) for request in plan.requests]
    except MlbenchError as err:
        raise _refused(err) from None


class RunQueue:
    """Starts recorded runs one after another, each when the one before it has ended."""

    def __init__(self, poll_s: float = 1.0):
        self.poll_s = poll_s
        self._pending: deque[tuple[Source, RunRecord]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, source: Source, records: list[RunRecord]) -> None:
        with self._lock:
            self._pending.extend((source, r) for r in records)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="mlbench-run-queue", daemon=True)
                self._thread.start()

    def _next(self) -> tuple[Source, RunRecord] | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    def _work(self) -> None:
        while not self._stop.is_set():
            item = self._next()
            if item is None:
                return
            source, record = item
            try:
                record = source.open_store().get(record.id)
                if record.state != PENDING:  # cancelled or deleted while it waited
                    continue
                source.launcher(record).start_detached(record)
                while not self._stop.is_set() and source.open_store().get(record.id).active:
                    time.sleep(self.poll_s)
            except MlbenchError:
                continue

    def close(self) -> None:
        """The dashboard stops: the runs that have not started yet are cancelled, with why."""
        self._stop.set()
        with self._lock:
            left, self._pending = list(self._pending), deque()
        for source, record in left:
            source.open_store().mark_ended(record.id, CANCELLED,
                                           reason="the dashboard that queued it stopped before its turn")
