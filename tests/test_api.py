"""The public Python API (docs/python-api.md): real runs through ``mlbench.run``, the same
documents as `mlbench status -o json`, the events as exact rows, options that cannot drift from
`mlbench run`'s, and an ``import mlbench`` that costs nothing.

The module's real runs are the documentation's own examples: ``page`` executes every ``python``
block of docs/python-api.md in order, in a run store of its own, and the tests read what they
left (its ``run``: a 2-worker task2a run on synthetic data, 20 steps).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import mlbench
import mlbench.cli.commands
from mlbench import api
from mlbench.cli import cli
from mlbench.cli.output import SCHEMA_VERSION
from mlbench.errors import MlbenchError, RunNotFound, UsageError
from mlbench.launch.registry import launcher_options
from mlbench.results.events import FileSink
from mlbench.results.report import OVERVIEW_FIELDS
from mlbench.results.store import RunStore
from tests.helpers import mlbench as mlbench_cli
from tests.results.recorded import record_run

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
HEAVY = ("torch", "torchvision", "matplotlib", "numpy", "pandas", "boto3", "botocore", "kubernetes",
         "googleapiclient", "docker", "click")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Every python block of docs/python-api.md, run in order in one namespace and a run store
    of its own; yields (the namespace, the environment of that store)."""
    base = tmp_path_factory.mktemp("api-page")
    env = {"MLBENCH_HOME": str(base / "home"), "MLBENCH_CONFIG_DIR": str(base / "config"),
           "MLBENCH_DATA": str(base / "data")}
    namespace: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        for block in python_blocks(PAGE.read_text(encoding="utf-8")):
            exec(compile(block, str(PAGE), "exec"), namespace)
    return namespace, {**os.environ, **env}


def _status_json(env: dict, *args: str) -> dict:
    proc = mlbench_cli("status", *args, "-o", "json", env=env, check=True)
    document = json.loads(proc.stdout)
    assert document.pop("schema_version") == SCHEMA_VERSION
    return document


def test_the_page_has_examples_of_every_call():
    code = "\n".join(python_blocks(PAGE.read_text(encoding="utf-8")))
    for call in ("mlbench.run(", "mlbench.runs(", "mlbench.get(", "mlbench.compare(", ".events(", ".wait(",
                 "detach=True", "repeat="):
        assert call in code


def test_a_real_run_is_what_status_json_says_of_it(page):
    namespace, env = page
    run = namespace["run"]
    assert isinstance(run, mlbench.Run) and run.state == "finished" and run.workers == 2
    assert run.task == "task2a" and run.summary["steps"] == 20 and run.result["steps"] == 20
    document = _status_json(env, run.id)
    assert run.to_dict() == document
    assert list(run.to_dict()) == list(document)  # the same keys in the same order
    # and every run of the store is the list of `status -o json`, in its order
    listed = _status_json(env)["runs"]
    assert [info.to_dict() for info in api.runs(home=env["MLBENCH_HOME"])] == listed
    repeated = [r.id for r in namespace["repeated"].runs][::-1]
    assert [r["id"] for r in listed] == [*repeated, namespace["done"].id, run.id]  # newest first


def test_a_run_reports_rank_0s_events_as_they_come_and_its_rows_are_its_files(page):
    namespace, _ = page
    run, seen = namespace["run"], namespace["seen"]
    rows = run.events(frame=False)
    ranks = [[json.loads(line) for line in (run.run_dir / "events" / f"rank-{r}.jsonl").read_text().splitlines()]
             for r in (0, 1)]
    assert sorted(rows, key=lambda e: (e["rank"], e["time"])) == ranks[0] + ranks[1]
    assert [e["time"] for e in rows] == sorted(e["time"] for e in rows)
    assert seen == ranks[0]
    frame = run.events()
    assert list(frame.columns) == list(api.EVENT_COLUMNS)
    assert frame.to_dict("records") == rows


def test_a_detached_run_is_waited_for(page):
    namespace, _ = page
    started, done = namespace["started"], namespace["done"]
    assert started.id == done.id and started.workers == 1
    assert done.state == "finished" and done.exit_code == 0 and not done.active
    assert done.summary["steps"] == 5 and done.finished_at >= done.started_at


def _recorded_store(home: Path) -> tuple[RunStore, list[str]]:
    store = RunStore(home)
    ids = [record_run(store, workers=k, tta=tta).id for k, tta in ((1, 20.0), (4, 8.0), (2, None))]
    return store, ids


def test_run_info_has_the_keys_of_a_status_entry_in_their_order():
    assert mlbench.RunInfo._fields() == list(OVERVIEW_FIELDS)


def test_runs_and_get_read_a_store_as_status_does(tmp_path):
    home = tmp_path / "store"
    _, (one, four, two) = _recorded_store(home)
    assert [r.id for r in api.runs(home=home)] == [two, four, one]
    assert [r.workers for r in api.runs(home=home, sort="workers")] == [1, 2, 4]
    assert [r.id for r in api.runs(home=home, sort="-time_to_accuracy")] == [one, four, two]
    assert [r.id for r in api.runs(home=home, limit=1)] == [two]
    # the CLI's list is the API's, key for key (its store: MLBENCH_HOME)
    result = CliRunner().invoke(cli, ["status", "-o", "json"], env={"MLBENCH_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["runs"] == [r.to_dict() for r in api.runs(home=home)]
    for ref in (four, four[:5]):
        run = api.get(ref, home=home)
        result = CliRunner().invoke(cli, ["status", four, "-o", "json"], env={"MLBENCH_HOME": str(home)})
        assert {**run.to_dict(), "schema_version": SCHEMA_VERSION} == json.loads(result.output)
    assert run.workers == 4 and run.goal_reached is True and run.time_to_accuracy == 8.0
    assert api.get(four, home=home) == run and api.runs(home=home, limit=1)[0] != run


def test_compare_is_what_compare_json_prints_and_keeps_two_optimizers_apart(tmp_path):
    """Two repeats of each of two optimizers on 1 and 2 workers: two families of two rows each,
    the document `mlbench compare -o json` prints, key for key."""
    home = tmp_path / "store"
    store = RunStore(home)
    for optimizer in ("centralized-sgd", "model-averaging"):
        for seed in (0, 1):
            for k, tta in ((1, 20.0), (2, 11.0 + seed)):
                record_run(store, workers=k, tta=tta, seed=seed, optimizer=optimizer)
    document = mlbench.compare(task="task1a", home=home)
    result = CliRunner().invoke(cli, ["compare", "--task", "task1a", "-o", "json"], env={"MLBENCH_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert {**document, "schema_version": SCHEMA_VERSION} == json.loads(result.output)
    families = document["families"]
    assert sorted(f["optimizer"] for f in families) == ["centralized-sgd", "model-averaging"]
    assert all([row["workers"] for row in f["groups"]] == [1, 2] for f in families)
    assert all(row["runs"] == 2 for f in families for row in f["groups"])
    # the seed is pooled as repeats; pooling the optimizer too makes one family of four repeats
    pooled = mlbench.compare(task="task1a", pool=["optimizer"], home=home)
    assert len(pooled["families"]) == 1 and pooled["pooled"] == ["optimizer"]
    with pytest.raises(UsageError, match=r"^runs='abc': give a list"):
        mlbench.compare("abc", home=home)
    with pytest.raises(UsageError, match=r"^pool='seed': give a list"):
        mlbench.compare(task="task1a", pool="seed", home=home)


def test_without_home_the_api_reads_the_current_store(isolated_home):
    _, ids = _recorded_store(isolated_home)
    assert [r.id for r in mlbench.runs()] == ids[::-1]
    assert mlbench.get(ids[0]).id == ids[0]


def test_events_are_the_rows_the_workers_wrote_in_time_order(tmp_path):
    store = RunStore(tmp_path / "store")
    record = store.create(task="task2a", workers=2, division="closed",
                          run_json={"task": "task2a", "division": "closed", "config": {"workers": 2}})
    written = {0: [(10.0, 0.0, 0, "environment", {"host": "lab"}), (12.0, 0.5, 5, "train/loss", 0.25),
                   (14.5, 1.0, 10, "result", {"steps": 10})],
               1: [(11.0, 0.5, 5, "train/loss", 0.5), (13.0, 1.0, 10, "comm/bytes", 4096)]}
    for rank, events in written.items():
        sink = FileSink(record.run_dir, rank)
        for when, epoch, step, name, value in events:
            sink.write({"time": when, "rank": rank, "epoch": epoch, "step": step, "name": name, "value": value})
        sink.close()
    with open(record.run_dir / "events" / "rank-1.jsonl", "a", encoding="utf-8") as f:
        f.write('{"time": "x", "rank": 1}\n{"time": 15.0, "rank": 1, "epo')  # a bad line, a torn one
    rows = api.get(record.id, home=store.home).events(frame=False)
    assert rows == [
        {"time": 10.0, "rank": 0, "epoch": 0.0, "step": 0, "name": "environment", "value": {"host": "lab"}},
        {"time": 11.0, "rank": 1, "epoch": 0.5, "step": 5, "name": "train/loss", "value": 0.5},
        {"time": 12.0, "rank": 0, "epoch": 0.5, "step": 5, "name": "train/loss", "value": 0.25},
        {"time": 13.0, "rank": 1, "epoch": 1.0, "step": 10, "name": "comm/bytes", "value": 4096},
        {"time": 14.5, "rank": 0, "epoch": 1.0, "step": 10, "name": "result", "value": {"steps": 10}},
    ]
    frame = api.get(record.id, home=store.home).events()
    assert frame["step"].tolist() == [0, 5, 5, 10, 10] and frame.loc[1, "value"] == 0.5
    assert frame.to_dict("records") == rows


def test_events_without_pandas_are_a_list_and_a_frame_asked_for_is_an_error(tmp_path, monkeypatch):
    store, ids = _recorded_store(tmp_path / "store")
    run = api.get(ids[0], home=store.home)
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    rows = run.events()
    assert isinstance(rows, list) and rows == run.events(frame=False) and rows
    with pytest.raises(MlbenchError, match="pip install pandas"):
        run.events(frame=True)


def test_mistakes_raise_one_sentence_and_record_nothing(isolated_home):
    cases = [(dict(workers=0), "the number of workers must be at least 1, not 0"),
             (dict(time_budget="soon"), "invalid duration 'soon'"),
             (dict(time_budget=-5), "--time-budget -5: give a duration above 0 seconds"),
             (dict(overrides={"no_such_key": 1}), "--set 'no_such_key=1': no task has a setting 'no_such_key'"),
             (dict(watchdog="1s"), "--watchdog 1s: at least 5s"),
             (dict(bandwidth="1gbit,10gbit"), "mlbench.run makes one run"),
             (dict(launch={"partition": "gpu"}), "--partition is an option of Slurm runs")]
    for options, message in cases:
        kwargs = {"workers": 2, "data": "synthetic", **options}
        with pytest.raises(UsageError) as caught:
            mlbench.run("task2a", **kwargs)
        assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(UsageError, match="limit 0"):
        mlbench.runs(limit=0)
    with pytest.raises(UsageError, match="--sort nothing: not a field"):
        mlbench.runs(sort="nothing")
    with pytest.raises(RunNotFound, match="no run 'nope'"):
        mlbench.get("nope")
    assert RunStore(isolated_home).list() == []


def test_overrides_as_a_mapping_are_what_set_makes():
    mapping = api.plan("task1a", [2], overrides={"momentum": 0, "lr.milestones": [50, 75], "nesterov": False})
    pairs = api.plan("task1a", [2], overrides=["momentum=0", "lr.milestones=50,75", "nesterov=false"])
    assert mapping.requests[0].overrides == pairs.requests[0].overrides == {
        "momentum": 0.0, "lr.milestones": (50, 75), "nesterov": False}
    assert api.plan("task2a", [2], time_budget=90).requests[0].time_budget_s == \
        api.plan("task2a", [2], time_budget="1m30s").requests[0].time_budget_s == 90.0
    assert api.plan("task2a", [2], watchdog=None).requests[0].watchdog_s is None
    assert api.plan("task2a", [2], watchdog="off").requests[0].watchdog_s is None


def test_every_option_of_mlbench_run_is_one_declaration_that_the_cli_and_the_api_are_made_from():
    from mlbench.launch.options import RUN_OPTIONS
    from mlbench.launch.plan import RunRequest

    command = cli.commands["run"]
    launcher_names = {o.name for o in launcher_options()}
    declared = {o.name: o for o in RUN_OPTIONS}
    clicked = {p.name: p for p in command.params if isinstance(p, click.Option)
               and p.name not in launcher_names and p.name != "output"}
    assert list(clicked) == list(declared)  # the same options, in the declared order
    group = click.Context(cli, info_name="mlbench", **cli.context_settings)
    given = command.make_context("run", ["task2a", "2"], parent=group).params
    for name, option in declared.items():
        assert option.flag in clicked[name].opts, name
        assert clicked[name].help == option.description, name
        # what the command passes on when the option is not given is the API's default
        assert given[name] == (() if option.multiple else option.default), name
    for function, leading in ((api.run, {"task", "workers"}), (api.plan, {"task", "workers"})):
        params = inspect.signature(function).parameters
        options = [n for n in params if n not in leading | {"launch", "home", "on_event", "progress"}]
        # run makes one run (no repeat); plan makes requests, which nobody follows yet (no log_to)
        assert set(options) == set(declared) - ({"log_to"} if function is api.plan else {"repeat"})
        assert all(params[n].default == declared[n].default for n in options)
    # every field of a run request is set by a declared option, or by the planning itself
    set_by_options = set()
    for option in RUN_OPTIONS:
        if option.target == "request":
            set_by_options |= set(option.request_fields(option.default))
    planned = {"task", "workers", "group_id", "network"}
    assert {f.name for f in dataclasses.fields(RunRequest)} == set_by_options | planned
    assert all(option.role in ("computes", "watches", "seed", "plans") for option in RUN_OPTIONS)


def test_an_option_the_api_does_not_know_is_refused_with_the_nearest_name(isolated_home):
    with pytest.raises(UsageError, match="no option 'time_budgt'; did you mean time_budget"):
        api.plan("task2a", [2], time_budgt="10m")
    with pytest.raises(UsageError, match="no launcher option 'partiton'; did you mean partition"):
        mlbench.run("task2a", 1, data="synthetic", launch={"slurm": True, "partiton": "gpu"})
    with pytest.raises(UsageError, match="no launcher option 'slrum'; did you mean slurm"):
        mlbench.run("task2a", 1, data="synthetic", launch={"slrum": True})
    for workers in (2.5, "2", True):
        with pytest.raises(UsageError, match="whole number of workers") as caught:
            mlbench.run("task2a", workers, data="synthetic")
        assert caught.value.option == "workers"
    with pytest.raises(UsageError) as caught:
        api.plan("task2a", [2], time_budget="soon")
    assert caught.value.option == "time_budget"
    assert not (isolated_home / "runs").exists() or not any((isolated_home / "runs").iterdir())


def test_import_mlbench_imports_nothing_heavy_and_the_api_no_torch():
    code = ("import json, sys, mlbench; first = sorted(sys.modules); mlbench.run; "
            "print(json.dumps([[m for m in first if m.startswith('mlbench')], "
            "sorted({m.split('.')[0] for m in sys.modules})]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True, env=dict(os.environ))
    package, loaded = json.loads(proc.stdout)
    assert package == ["mlbench", "mlbench.version"]
    assert "mlbench" in loaded and loaded and set(loaded).isdisjoint(HEAVY), set(loaded) & set(HEAVY)
    assert mlbench.run is api.run and mlbench.Run is api.Run and "get" in dir(mlbench)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mlbench.nope  # noqa: B018


#: What only the public API may do with runs: the CLI and the dashboard ask it (mlbench.api).
RUN_ACTIONS = re.compile(r"\.(start_detached|prepare_resume|run_attached|create_all|wait_for_runs)\(|"
                         r"launcher_of\([^)]*\)\.(cancel|follow)\(|session\.execute\(|store\.delete\(")


def test_the_cli_and_the_dashboard_start_resume_cancel_delete_follow_and_wait_through_the_api():
    repo = Path(api.__file__).parent
    offenders = [f"{path.relative_to(repo)}:{n}" for folder in ("cli", "dashboard")
                 for path in sorted((repo / folder).glob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if RUN_ACTIONS.search(line)]
    assert offenders == []


def test_runs_are_created_started_resumed_waited_for_cancelled_and_deleted_through_the_api(isolated_home):
    finished = mlbench.run("task2a", 1, data="synthetic", max_steps=20, log_every=10, checkpoint_every="10steps")
    assert (finished.state, finished.summary["steps"]) == ("finished", 20)
    assert api.cancel(finished.id).state == "finished"      # an ended run is left as it is
    heard = []
    resumed = api.resume(finished.id, max_steps=30, on_start=lambda run: heard.append(run.state))
    assert heard == ["pending"] and (resumed.state, resumed.summary["steps"]) == ("finished", 30)
    assert [r["from_step"] for r in resumed.resumes] == [20]
    [pending] = api.create(api.plan("task2a", [1], data="synthetic", max_steps=5, seed=3))
    assert pending.state == "pending" and pending.seed == 3
    started = pending.start()
    code, [ended] = api.wait([started.id], timeout=120)
    assert (code, ended.state) == (0, "finished")
    assert api.follow(ended.id).state == "finished"
    gone = api.delete(ended.id)
    assert gone.id == ended.id and not ended.run_dir.exists()
    with pytest.raises(RunNotFound):
        api.get(ended.id)


def test_a_model_that_does_not_exist_and_a_run_that_is_no_text_are_refused_before_anything_is_recorded(
        isolated_home):
    with pytest.raises(UsageError, match=r"--set model=bogus: unknown model; valid models are resnet20-v1") as caught:
        mlbench.run("task1a", 1, data="synthetic", max_steps=1, overrides={"model": "bogus"})
    assert caught.value.option == "overrides"
    for ref in (123, None, ""):
        with pytest.raises(UsageError, match="give a run's id, a prefix of it or its name, as text"):
            api.get(ref)
    assert api.runs() == []


def test_a_keyword_of_the_wrong_type_is_a_usage_error_of_one_line_that_names_it(isolated_home):
    """A script's wrong type (``workers="2"``, ``name=3``, ``limit="3"``) is mlbench's UsageError
    naming the keyword in its message and in ``err.option``, before anything is recorded; never
    a TypeError or AttributeError from deep inside."""
    plan = api.plan("task2a", [1], data="synthetic")
    calls = {
        "workers": lambda: mlbench.run("task2a", "2", data="synthetic"),
        "task": lambda: api.plan(2, [1]),
        "name": lambda: mlbench.run("task2a", 1, data="synthetic", name=3),
        "data_dir": lambda: api.plan("task2a", [1], data_dir=7),
        "checkpoint_every": lambda: api.plan("task2a", [1], checkpoint_every=3.5),
        "inject": lambda: api.plan("task2a", [2], inject=5),
        "optimizer": lambda: api.plan("task2a", [1], optimizer=3),
        "bandwidth": lambda: api.plan("task2a", [1], bandwidth=1e9),
        "log_to": lambda: mlbench.run("task2a", 1, data="synthetic", log_to=3),
        "launch": lambda: mlbench.run("task2a", 1, data="synthetic", launch=["slurm"]),
        "on_event": lambda: mlbench.run("task2a", 1, data="synthetic", on_event="print"),
        "request_plan": lambda: api.start("task2a"),
        "observer": lambda: api.start(plan, observer=print),
        "home": lambda: mlbench.runs(home=3),
        "limit": lambda: mlbench.runs(limit="3"),
        "sort": lambda: mlbench.runs(sort=["workers"]),
        "runs": lambda: api.wait("abc"),
        "timeout": lambda: api.wait(["abc"], timeout="10"),
        "max_steps": lambda: api.resume("abc", max_steps=2.5),
        "detach": lambda: api.resume("abc", detach="yes"),
    }
    for name, call in calls.items():
        with pytest.raises(UsageError) as caught:
            call()
        message = str(caught.value)
        assert caught.value.option == name and re.match(rf"{name}[= ]", message) and "\n" not in message, (
            name, message)
    with pytest.raises(UsageError) as caught:
        api.plan("task2a", [1], name=3)
    assert str(caught.value) == "name=3: give text or None"
    assert RunStore(isolated_home).list() == []


def test_a_home_that_does_not_exist_is_an_error_where_runs_are_read_and_a_new_store_where_they_are_recorded(
        tmp_path):
    missing = tmp_path / "no-such-store"
    line = (f"home {str(missing)!r} does not exist: give the folder of a run store (an MLBENCH_HOME), or None for "
            "the current store")
    for call in (lambda: api.runs(home=missing), lambda: api.get("abc", home=missing),
                 lambda: api.wait(["abc"], home=missing), lambda: api.follow("abc", home=missing),
                 lambda: api.cancel("abc", home=missing), lambda: api.delete("abc", home=missing),
                 lambda: api.resume("abc", home=missing)):
        with pytest.raises(UsageError) as caught:
            call()
        assert (str(caught.value), caught.value.option) == (line, "home")
    assert not missing.exists()
    with pytest.raises(UsageError, match="is not a folder"):
        api.runs(home=PAGE)
    [pending] = api.create(api.plan("task2a", [1], data="synthetic"), home=missing)   # recording makes the store
    assert [r.id for r in api.runs(home=missing)] == [pending.id]
