"""The new-run form: the choices of `mlbench run`, checked by the code `mlbench run` uses.

The form's fields are `mlbench run`'s options by their API names (:data:`FORM_OPTIONS`, declared
in :mod:`mlbench.launch.options`); its runs are planned by :func:`mlbench.api.plan`, as the CLI's,
and validated and recorded by the launcher the registry chooses for the store (``build_config``,
``check_optimizer``, the data check), so a wrong value is refused with the sentence the CLI
prints. Each refusal names the option it concerns (``MlbenchError.option``), and the sentence is
shown beside that field; one that concerns no field of the form is shown above it.

Several worker counts make several runs (one group id, as `mlbench run task1a 1 2 4`); they are
started one after another by :class:`RunQueue`, as the CLI runs them, so that they do not
compete for this machine's cores.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from typing import Any

from mlbench import api
from mlbench.dashboard.sources import CLUSTER, LOCAL, Source, Sources
from mlbench.errors import DataError, MlbenchError
from mlbench.launch.options import OPTIONS_BY_NAME, RUN_OPTIONS, RunOption
from mlbench.results.store import CANCELLED, PENDING, RunRecord
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.registry import TASKS, get_task
from mlbench.tasks.spec import AnySpec, TaskSpec

#: The form's fields, by the name of the `mlbench run` option each sets: every option of
#: :data:`mlbench.launch.options.RUN_OPTIONS` but those of how the CLI follows its runs
#: (``--detach``, ``--log-to``: the dashboard starts them detached and shows them itself);
#: ``task``, ``workers`` and ``where`` besides.
FORM_OPTIONS = tuple(option.name for option in RUN_OPTIONS if option.target != "follow")
#: The options new.html lays out itself (the light goal names the task's, the optimizer's
#: options are a box each, the data a choice of two); new.js makes every other one's field
#: from its declaration (:func:`form_fields`), so that a new option is in the form at once.
OWN_FIELDS = ("light", "stop_at_goal", "time_budget", "max_steps", "data", "data_dir", "optimizer",
              "optimizer_options", "overrides", "seed")


class FormError(MlbenchError):
    """The form was refused: a sentence per field."""

    exit_code = 2

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


def field_of(err: MlbenchError) -> str:
    """The form's field an error concerns: the option it names (an optimizer's own option as
    ``optimizer_options.NAME``, its box), else the form as a whole."""
    if err.option is not None and (err.option in FORM_OPTIONS or err.option in ("task", "workers")
                                   or err.option.startswith("optimizer_options.")):
        return err.option
    return "form"


def form_choices(sources: Sources) -> dict[str, Any]:
    """What the form offers: the tasks, the optimizers with their options, where to run."""
    from mlbench.optim.descriptors import describe_optimizers
    from mlbench.tasks.registry import reference_optimizers

    where = [{"key": LOCAL, "label": "this machine"}]
    if sources.cluster is not None:
        where.append({"key": CLUSTER, "label": sources.cluster.label})
    return {
        "tasks": [_task_choice(t) for t in TASKS.values()],
        "optimizers": describe_optimizers(reference_optimizers()),
        "where": where,
        "options": form_fields(),
    }


def form_fields() -> list[dict[str, Any]]:
    """The form's options as declared (name, flag, label, kind, help, default, choices, whether
    it takes several values one a line, whether its box says "no"), in their order;
    ``own_field``: new.html lays it out itself."""
    kinds = {bool: "bool", int: "int", float: "float", str: "str"}
    return [{"name": o.name, "flag": o.flag, "label": o.flag.lstrip("-").replace("-", " ").capitalize(),
             "kind": kinds.get(o.kind, "str"), "help": o.description, "default": o.default,
             "choices": list(o.choices) if o.choices else None, "metavar": o.metavar,
             "multiple": o.multiple, "negated": o.negated, "own_field": o.name in OWN_FIELDS}
            for o in RUN_OPTIONS if o.name in FORM_OPTIONS]


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


def form_options(form: dict[str, Any]) -> tuple[str, list[int], dict[str, Any]]:
    """The task, the worker counts and the `mlbench run` options (by their API names) that the
    form's fields hold, or a FormError naming every field that cannot be read as its option's
    value; what the values mean is checked by :func:`mlbench.api.plan`, as for the CLI."""
    errors: dict[str, str] = {}
    task = str(form.get("task") or "")
    tokens = re.split(r"[\s,]+", str(form.get("workers") or "").strip())
    counts = [_integer(tok, "workers", errors) for tok in tokens if tok]
    if not counts and "workers" not in errors:
        errors["workers"] = "give one or more worker counts, e.g. 1 2 4"
    given = form.get("optimizer_options") or {}
    if not isinstance(given, dict):
        errors.setdefault("optimizer_options", f"optimizer_options {given!r}: send the optimizer's options as a "
                                               'JSON object of NAME: VALUE, e.g. {"rank": "2"}')
        given = {}
    options: dict[str, Any] = {
        "light": bool(form.get("light")),
        "stop_at_goal": bool(form.get("stop_at_goal", True)),
        "time_budget": str(form.get("time_budget") or "").strip() or None,
        "max_steps": _integer(form.get("max_steps"), "max_steps", errors),
        "seed": _integer(form.get("seed"), "seed", errors) or 0,
        "data": str(form.get("data") or "real"),
        "data_dir": str(form.get("data_dir") or "").strip() or None,
        "optimizer": str(form.get("optimizer") or "") or None,
        "optimizer_options": {str(k): str(v).strip() for k, v in given.items() if str(v).strip()},
        "overrides": [line.strip() for line in re.split(r"[\n;]+", str(form.get("overrides") or ""))
                      if line.strip()],
    }
    for name in FORM_OPTIONS:
        if name not in OWN_FIELDS and name in form:
            options[name] = _declared_value(OPTIONS_BY_NAME[name], form[name], errors)
    if errors:
        raise FormError(errors)
    return task, [k for k in counts if k is not None], options


def _declared_value(option: RunOption, given: Any, errors: dict[str, str]) -> Any:
    """A field new.js made from the option's declaration, read as the option's value (an empty
    one: its default); what the value means is :func:`mlbench.api.plan`'s to check."""
    if option.kind is bool:
        return given if isinstance(given, bool) else option.default
    if option.multiple:
        values = given if isinstance(given, list) else re.split(r"[\n;]+", str(given or ""))
        return [str(v).strip() for v in values if str(v).strip()] or option.default
    text = str(given if given is not None else "").strip()
    if not text:
        return option.default
    if option.kind is int:
        return _integer(text, option.name, errors)
    if option.kind is float:
        try:
            return float(text)
        except ValueError:
            errors.setdefault(option.name, f"{text!r} is not a number")
            return None
    return text


def _refused(err: MlbenchError) -> FormError:
    name = "data_dir" if isinstance(err, DataError) else field_of(err)
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
    """Validate the form and record its runs (pending), planned by :func:`mlbench.api.plan` as
    `mlbench run` plans them and created by the launcher the registry chooses for the store;
    nothing is recorded when one is wrong."""
    task, counts, options = form_options(form)
    source = _where(sources, form.get("where") or LOCAL)
    try:
        get_task(task)
        runs = api.create(api.plan(task, counts, **options), home=source.open_store())
        return source, [run.record for run in runs]
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
                run = api.get(record.id, home=source.open_store())
                if run.state != PENDING:  # cancelled or deleted while it waited
                    continue
                run.start()
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
