"""Scripting a run: `mlbench run --detach -o json` prints the started run's record, and
`mlbench wait RUN...` returns with the exit code `mlbench run` would have given (the worst of
several runs), or 124 when its --timeout passes first. Real detached runs, real workers."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mlbench.cli.output import SCHEMA_VERSION
from mlbench.results.report import OVERVIEW_FIELDS
from mlbench.results.store import RunStore
from tests.helpers import mlbench

SYNTHETIC = ("task2a", "1", "--data", "synthetic", "--log-every", "1")
WRONG_PLUGINS = Path(__file__).parent / "optim" / "wrong_plugins.py"


def _detached(*args: str) -> dict:
    proc = mlbench("run", *args, "--detach", "-o", "json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


def test_run_detach_json_prints_the_record_and_wait_exits_as_run_would_for_a_missed_goal(libsvm_dir):
    record = _detached("task2a", "1", "--data-dir", str(libsvm_dir), "--set", "max_epochs=1",
                       "--set", "goal_full=0.9999")
    assert next(iter(record)) == "id" and record.pop("schema_version") == SCHEMA_VERSION
    assert list(record) == list(OVERVIEW_FIELDS)
    stored = RunStore().get(record["id"])
    assert (record["name"], record["task"], record["workers"], record["launcher"]) == (
        stored.name, "task2a", 1, "local")
    assert record["state"] in ("pending", "running") and record["finished_at"] is None

    waited = mlbench("wait", record["id"])
    assert (waited.returncode, waited.stderr) == (3, ""), waited.stdout + waited.stderr
    assert waited.stdout.startswith(f"Run {record['id']} ({record['name']}) finished: "
                                    "Goal test accuracy >= 99.99% not reached")
    assert waited.stdout.count("\n") == 1
    document = yaml.safe_load(mlbench("wait", record["name"], "-o", "yaml").stdout)
    assert document["exit_code"] == 3 and document["schema_version"] == SCHEMA_VERSION
    (run,) = document["runs"]
    assert (run["id"], run["state"], run["goal"], run["goal_reached"]) == (record["id"], "finished", 0.9999, False)


def test_wait_exits_with_the_worst_code_of_several_runs_and_124_at_its_timeout():
    # an optimizer plug-in that raises in its second step: the run fails, whatever the machine's load
    # (removing the data under a starting worker raced with a forked worker that had already read it)
    failing = _detached(*SYNTHETIC, "--max-steps", "5", "--optimizer", f"{WRONG_PLUGINS}:Raiser")["id"]
    done = _detached(*SYNTHETIC, "--max-steps", "2")["id"]
    # a run that outlasts this test whatever the machine's speed: no step or epoch cap it can reach
    # (one thread trains task2a's 10 epochs of synthetic data in seconds)
    long = _detached(*SYNTHETIC, "--max-steps", "1000000", "--set", "max_epochs=1000000")["id"]

    both = mlbench("wait", done, failing)
    assert both.returncode == 1, both.stdout + both.stderr
    lines = both.stdout.splitlines()
    assert lines[0].startswith(f"Run {done} (task2a-1w-") and " finished: Finished (max-steps): 2 steps" in lines[0]
    assert lines[1].startswith(f"Run {failing} (task2a-1w-") and " failed: " in lines[1]
    assert mlbench("wait", done).returncode == 0

    timed_out = mlbench("wait", long, done, "--timeout", "1s", "-o", "json")
    assert timed_out.returncode == 124, timed_out.stdout + timed_out.stderr
    assert timed_out.stderr == ("Stopped waiting after --timeout 1s: 1 run(s) still going on "
                                "(`mlbench cancel RUN` stops one).\n")
    document = json.loads(timed_out.stdout)
    assert document["exit_code"] == 124
    assert [r["id"] for r in document["runs"]] == [long, done]
    assert document["runs"][0]["state"] in ("pending", "running") and document["runs"][1]["state"] == "finished"
    assert RunStore().get(long).active  # waiting never touches the run

    assert mlbench("cancel", long).returncode == 0
    cancelled = mlbench("wait", done, failing, long)
    assert cancelled.returncode == 130, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout.splitlines()[2] == f"Run {long} ({RunStore().get(long).name}) was cancelled."


def test_wait_and_run_refuse_wrong_arguments_in_one_line():
    for args, message in (
            (("wait", "nosuchrun"), "Error: no run 'nosuchrun'; `mlbench status` lists the runs\n"),
            (("wait", "nosuchrun", "--timeout", "0"),
             "Error: invalid duration '0': it must be longer than 0 seconds\n"),
            (("run", *SYNTHETIC, "-o", "json"),
             "Error: -o json prints the record of a run started with --detach: add --detach (then "
             "`mlbench wait RUN -o json` gives its result)\n")):
        proc = mlbench(*args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", message)
    assert RunStore().list() == []  # the refused run was not recorded
