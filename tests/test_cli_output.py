"""`-o json|yaml`, shell completion and a CLI that starts without torch, on real runs.

One module-wide store holds a real `mlbench run task2a 1 2` group on a LIBSVM pair (the
`libsvm_dir` fixture); every test reads it through the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from mlbench.cli.output import SCHEMA_VERSION
from mlbench.results.environment import may_have_gpu
from mlbench.results.report import OVERVIEW_FIELDS
from mlbench.results.store import RunStore
from tests.helpers import events, mlbench, run_json, wait_for

OVERVIEW_KEYS = {"id", "name", "task", "workers", "workers_text", "state", "reason", "restarts", "division",
                 "optimizer", "model", "framework", "network",
                 "division_text", "open_reasons",
                 "launcher", "seed", "group_id", "created_at", "started_at", "finished_at", "epoch",
                 "metric", "metric_value", "metric_title", "metric_unit", "metric_text", "goal", "goal_reached",
                 "time_to_accuracy"}
HEAVY = ("torch", "torchvision", "matplotlib", "numpy", "boto3", "botocore", "kubernetes",
         "googleapiclient", "docker")


@pytest.fixture(scope="module")
def group_home(tmp_path_factory, libsvm_dir):
    """A run store with a real group of task2a runs (1 and 2 workers); yields (home, group id)."""
    base = tmp_path_factory.mktemp("output-runs")
    with pytest.MonkeyPatch.context() as patch:
        for name, folder in (("MLBENCH_HOME", "home"), ("MLBENCH_CONFIG_DIR", "config"),
                             ("MLBENCH_DATA", "data")):
            patch.setenv(name, str(base / folder))
        run = mlbench("run", "task2a", "1", "2", "--data-dir", str(libsvm_dir), "--light",
                      "--log-every", "10", "--max-steps", "60", check=True)
    group = run.stdout.split("mlbench compare --group ")[1].split()[0]
    return base, group


@pytest.fixture
def runs(group_home, monkeypatch):
    """This test's run store is the module's (its config folder stays its own); returns the
    group id."""
    base, group = group_home
    monkeypatch.setenv("MLBENCH_HOME", str(base / "home"))
    monkeypatch.setenv("MLBENCH_DATA", str(base / "data"))
    return group


def _json(*args: str):
    proc = mlbench(*args, "-o", "json", check=True)
    assert proc.stderr == ""
    document = json.loads(proc.stdout)
    assert document.pop("schema_version") == SCHEMA_VERSION
    return document


def test_status_json_lists_every_run_with_the_documented_keys(runs):
    listed = _json("status")["runs"]
    assert [r["workers"] for r in listed] == [2, 1]  # newest first: a script's runs[0] is the last run
    assert listed[0]["created_at"] > listed[1]["created_at"]
    for run in listed:
        assert set(run) == OVERVIEW_KEYS
        assert run["state"] == "finished" and run["group_id"] == runs and run["task"] == "task2a"
        assert run["metric"] == "accuracy" and run["goal"] == 0.8
        assert 0 <= run["metric_value"] <= 1 and run["epoch"] > 0
        assert run["started_at"] >= run["created_at"] and run["finished_at"] >= run["started_at"]
        assert (run["time_to_accuracy"] is not None) == run["goal_reached"]


def test_status_sorts_and_limits_the_list_by_any_key_of_its_entries(runs):
    assert tuple(OVERVIEW_KEYS) and set(OVERVIEW_FIELDS) == OVERVIEW_KEYS
    newest, oldest = _json("status")["runs"]
    assert _json("status", "--sort", "workers")["runs"] == [oldest, newest]
    assert _json("status", "--sort", "-workers")["runs"] == [newest, oldest]
    assert _json("status", "--sort", "created_at", "--limit", "1")["runs"] == [oldest]
    assert _json("status", "--limit", "1")["runs"] == [newest]
    assert _json("status", "--sort", "reason", "--all")["runs"] == [newest, oldest]  # no value: newest first
    table = mlbench("status", "--sort", "workers", check=True).stdout.splitlines()
    assert [line.split()[0] for line in table[2:]] == [oldest["id"], newest["id"]]


@pytest.mark.parametrize("args, message", [
    (("--sort", "speed"), "Error: --sort speed: not a field of a run; choose from id, name, task, "),
    (("--all", "--limit", "3"), "Error: --all lists every run and --limit N the first N: give one of them\n"),
    (("some-run", "--sort", "name"), "Error: --sort, --limit and --all choose runs for the list: give no "
                                     "RUN with them\n"),
    (("--limit", "0"), "Usage: "),  # click's own: usage, then the error
])
def test_status_refuses_a_wrong_sort_or_limit(runs, args, message):
    proc = mlbench("status", *args)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr


def test_sort_puts_runs_without_a_value_last_in_either_direction():
    from mlbench.results.report import sort_runs

    rows = [{"id": i, "created_at": float(i), "time_to_accuracy": t} for i, t in enumerate([None, 5.0, 2.0, 5.0])]
    assert [r["id"] for r in sort_runs(rows, "time_to_accuracy")] == [2, 3, 1, 0]
    assert [r["id"] for r in sort_runs(rows, "time_to_accuracy", descending=True)] == [3, 1, 2, 0]


def test_status_and_compare_name_each_runs_framework():
    """A JAX run and a PyTorch run of task 2a (recorded; this test's own store): `status` has a
    FRAMEWORK column, `status RUN` a framework line, --sort orders by it, and `compare -o json`
    keeps them in two families."""
    from tests.results.recorded import record_run

    store = RunStore()
    torch_run = record_run(store, workers=2, task="task2a", tta=10.0)   # run.json from before --framework
    jax_run = record_run(store, workers=2, task="task2a", tta=12.0, framework="jax")
    table = mlbench("status", check=True).stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "NAME", "TASK", "FRAMEWORK", "WORKERS"]
    assert {line.split()[0]: line.split()[3] for line in table[2:]} == {torch_run.id: "pytorch", jax_run.id: "jax"}
    for run, name in ((jax_run, "jax"), (torch_run, "pytorch")):
        lines = mlbench("status", run.id, check=True).stdout.splitlines()
        assert lines[3].split() == ["framework", name]
    assert [r["id"] for r in _json("status", "--sort", "-framework")["runs"]] == [torch_run.id, jax_run.id]
    families = _json("compare", "--task", "task2a")["families"]
    assert [(f["framework"], g["run_ids"]) for f in families for g in f["groups"]] == [
        ("jax", [jax_run.id]), ("pytorch", [torch_run.id])]


def test_status_run_yaml_holds_the_summary_the_result_and_its_sentence(runs):
    first = _json("status")["runs"][0]
    proc = mlbench("status", first["name"], "-o", "yaml", check=True)
    run = yaml.safe_load(proc.stdout)
    assert run.pop("schema_version") == SCHEMA_VERSION
    assert {k: run[k] for k in OVERVIEW_KEYS} == first
    summary = run["summary"]
    assert summary["steps"] > 0 and summary["samples"] > 0 and summary["throughput"] > 0
    assert set(summary["phases"]) == {"data", "forward", "backward", "communication", "optimizer"}
    assert abs(sum(p["share"] for p in summary["phases"].values()) - 1) < 1e-6
    assert summary["evaluations"][-1]["accuracy"] == run["metric_value"]
    assert summary["errors"] == []
    assert run["result"]["goal"] == 0.8 and run["result"]["steps"] == summary["steps"]
    assert run["result_sentence"].startswith("Goal test accuracy >= 80.00% ")


def test_compare_json_has_one_family_with_a_group_per_worker_count(runs):
    doc = _json("compare", "--group", runs, "--price-per-hour", "0.19")
    assert doc["task"] == "task2a" and doc["usd_per_node_hour"] == 0.19 and doc["skipped"] == []
    (family,) = doc["families"]
    assert family["measure"] == "time to accuracy" and family["goal"] == 0.8
    assert [g["workers"] for g in family["groups"]] == [1, 2]
    ids = {r["workers"]: r["id"] for r in _json("status")["runs"]}
    for group in family["groups"]:
        assert group["runs"] == 1 and group["run_ids"] == [ids[group["workers"]]]
        assert group["throughput"]["median"] > 0
        assert 0 <= group["communication_share"] <= 1
        if group["converged"]:
            tta = group["time_to_accuracy"]
            assert tta["median"] == tta["min"] == tta["max"] > 0
            assert group["cost_to_accuracy"]["median"] > 0
        else:  # not reached: null, never Infinity
            assert group["time_to_accuracy"]["median"] is None


def test_tasks_optimizers_prices_and_clusters_parse_as_json_and_yaml(runs):
    from mlbench.cloud import config

    config.save_cluster(config.ClusterRecord(provider="kind", name="demo", context="mlbench-kind-demo",
                                             kubeconfig=config.config_dir() / "kubeconfig", nodes=2))
    tasks = yaml.safe_load(mlbench("tasks", "-o", "yaml", check=True).stdout)
    assert tasks["schema_version"] == SCHEMA_VERSION
    assert [t["name"] for t in tasks["tasks"]] == ["task0a", "task1a", "task2a", "task3a", "task4b", "task5a"]
    assert [t["metric"] for t in tasks["tasks"][1:]] == ["accuracy", "accuracy", "perplexity", "bleu", "val_loss"]
    assert tasks["tasks"][1]["goal_full"] == 0.8 and "resnet20-v1" in tasks["models"]
    prices = _json("prices")["prices"]
    assert {"name": "n1-standard-4", "usd_per_hour": 0.19} in [
        {k: p[k] for k in ("name", "usd_per_hour")} for p in prices]
    clusters = yaml.safe_load(mlbench("list-clusters", "--no-refresh", "-o", "yaml", check=True).stdout)
    assert clusters.pop("schema_version") == SCHEMA_VERSION
    assert clusters["clusters"] == [{
        "provider": "kind", "name": "demo", "current": False, "state": "not checked",
        "detail": "", "nodes": 2, "where": "this machine", "namespace": None, "image": None,
        "created_by_mlbench": True, "context": "mlbench-kind-demo",
        "kubeconfig": str(config.config_dir() / "kubeconfig"), "shared_storage_class": None}]
    optimizers = _json("optimizers")["optimizers"]
    assert optimizers[0]["name"] == "centralized-sgd" and optimizers[0]["closed_division"] is True
    assert {o["name"]: o["reference_of"] for o in optimizers if o["closed_division"]} == {
        "centralized-sgd": ["task1a", "task2a", "task3a"], "centralized-adam": ["task4b"],
        "centralized-adamw": ["task5a"]}


def test_charts_without_matplotlib_say_what_to_install_and_write_nothing(runs, tmp_path):
    from tests.test_extras import run_without

    proc = run_without("matplotlib", "charts", "--group", runs, "-d", str(tmp_path / "charts"))
    assert (proc.returncode, proc.stderr) == (
        1, "Error: this needs matplotlib, which is not installed: pip install 'mlbench-suite[charts]'\n")
    assert not (tmp_path / "charts").exists()


def test_a_wrong_format_is_a_usage_error(runs):
    proc = mlbench("status", "-o", "xml")
    assert proc.returncode == 2 and "'xml' is not one of 'table', 'json', 'yaml'" in proc.stderr


def _complete(words: str) -> list[str]:
    """What bash completion offers after ``words`` (the last word is the one completed)."""
    env = dict(os.environ, _MLBENCH_COMPLETE="bash_complete", COMP_WORDS=words,
               COMP_CWORD=str(len(words.split(" ")) - 1))
    proc = subprocess.run([sys.executable, "-m", "mlbench"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines() if line]


def test_completion_offers_run_ids_names_tasks_groups_and_clusters(runs):
    from mlbench.cloud import config

    config.save_cluster(config.ClusterRecord(provider="aws", name="bench", context="mlbench-aws-bench",
                                             kubeconfig=config.config_dir() / "kubeconfig", nodes=4))
    listed = _json("status")["runs"]
    newest_first = [v for r in listed for v in (r["id"], r["name"])]
    assert _complete("mlbench status ") == newest_first
    assert _complete("mlbench logs task2a-1") == [listed[1]["name"]]
    assert _complete(f"mlbench download {listed[1]['id'][:3]}") == [listed[1]["id"]]
    assert _complete("mlbench run task") == ["task0a", "task1a", "task2a", "task3a", "task4b", "task5a"]
    assert _complete("mlbench compare --group ") == [runs]
    assert _complete("mlbench set-cluster b") == ["bench"]
    assert _complete("mlbench delete-cluster aws ") == ["bench"]
    assert _complete("mlbench delete-cluster kind ") == []


_PROBE = """
import json, os, sys
from mlbench.cli import cli, commands
heavy = {h for h in sys.argv[1].split(",")}
loaded = {}
for args in json.loads(sys.argv[2]):
    env = args.pop(0)
    os.environ.update(env)
    try:
        cli.main(args, prog_name="mlbench")
    except SystemExit as stop:
        assert not stop.code, (args, stop.code)
    for key in env:
        del os.environ[key]
    loaded[" ".join(args) or str(env)] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(loaded), file=sys.stderr)
"""


def test_help_status_compare_and_completion_import_no_torch_or_sdk(runs):
    run_id = _json("status")["runs"][0]["id"]
    completion = {"_MLBENCH_COMPLETE": "bash_complete", "COMP_WORDS": "mlbench status ",
                  "COMP_CWORD": "2"}
    commands = [[{}, "--help"], [{}, "status"], [{}, "status", run_id], [{}, "status", "-o", "json"],
                [{}, "status", run_id, "-o", "yaml"], [{}, "compare", "--group", runs, "-o", "json"],
                [{}, "tasks", "-o", "json"], [{}, "optimizers", "-o", "json"], [{}, "prices"],
                [{}, "list-clusters"], [completion]]
    proc = subprocess.run([sys.executable, "-c", _PROBE, ",".join(HEAVY), json.dumps(commands)],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    assert loaded and all(not modules for modules in loaded.values()), loaded


@pytest.mark.skipif(may_have_gpu(), reason="a machine with a GPU device node asks torch whether it sees it")
def test_starting_a_run_validates_it_without_importing_torch():
    # options, topology, device and backend are checked, and the machine recorded, before any
    # worker starts: without torch's import (seconds on a small machine) in the CLI's process
    commands = [[{}, "run", "task2a", "2", "--data", "synthetic", "--max-steps", "2", "--detach",
                 "--optimizer", "decentralized-sgd", "--opt", "topology=ring"]]
    proc = subprocess.run([sys.executable, "-c", _PROBE, "torch", json.dumps(commands)],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stderr.strip().splitlines()[-1]).values()) == [[]]
    run = RunStore().list()[-1]
    wait_for(lambda: not RunStore().get(run.id).active, 120, "the run to end")
    assert RunStore().get(run.id).state == "finished"
    # what the CLI recorded without torch is what the worker, with torch, recorded
    worker = next(e["value"] for e in events(run) if e["name"] == "environment")
    recorded = run_json(run)["environment"]
    assert (recorded["torch"], recorded["cuda"], recorded["gpus"]) == (worker["torch"], worker["cuda"], worker["gpus"])


def test_importing_the_cli_imports_no_torch_matplotlib_or_cloud_sdk():
    code = ("import json, sys, mlbench.cli.commands; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True, env=dict(os.environ))
    loaded = set(json.loads(proc.stdout))
    assert "click" in loaded and loaded.isdisjoint(HEAVY), loaded & set(HEAVY)
