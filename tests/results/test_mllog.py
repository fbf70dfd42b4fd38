"""The MLPerf :::MLLOG log of a run, read back with the mlperf-logging package's own parser."""

from pathlib import Path

import pytest
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

from mlbench.errors import UsageError
from mlbench.results.mllog import check_mllog, write_mllog
from mlbench.results.store import CANCELLED, FAILED, FINISHED, RUNNING, RunStore

from tests.helpers import mlbench
from tests.results.recorded import T0, record_run

RULESET = "6.0.0"  # 6.1 also demands numerical-precision disclosures, which runs do not record yet


def parse(path: Path) -> dict[str, list]:
    lines, errors = mlp_parser.parse_file(str(path), ruleset=RULESET)
    assert errors == [] and lines
    by_key: dict[str, list] = {}
    for line in lines:
        by_key.setdefault(line.key, []).append(line)
    return by_key


@pytest.fixture
def store():
    return RunStore()


def test_a_finished_run_passes_the_common_mlperf_rules(store, tmp_path):
    run = record_run(store, workers=2, tta=9.0, wall=10.0, seed=3,
                     result_extra={"train_samples": 3200, "test_samples": 500})
    path = write_mllog(run, tmp_path / "run.mllog.txt")
    loglines, errors = mlp_parser.parse_file(str(path), ruleset=RULESET)
    assert errors == []
    checker = mlp_compliance.make_checker("training", RULESET, quiet=False, werror=True)
    common = Path(mlp_compliance.__file__).parent / f"training_{RULESET}" / "common.yaml"
    try:
        checker.configured_checks(loglines, str(common))
    finally:
        mlp_compliance.enqueued_configs.clear()  # the benchmark-specific rules are MLPerf's own
    messages = [*checker.overwritable.values(), *checker.not_overwritable, *checker.warnings.values()]
    assert messages == []


def test_the_log_says_what_the_run_did_and_when(store, tmp_path):
    run = record_run(store, workers=2, tta=9.0, wall=10.0, seed=3)
    log = parse(write_mllog(run, tmp_path / "run.mllog.txt"))
    value = {key: lines[0].value["value"] for key, lines in log.items()}
    assert value["submission_benchmark"] == "task1a" and value["submission_division"] == "closed"
    assert value["global_batch_size"] == 64 and value["seed"] == 3 and value["number_of_workers"] == 2
    assert value["opt_base_learning_rate"] == pytest.approx(0.1 / 256 * 32 * 2)
    # training started at T0 (rank 0's first reading: 5 s of training at T0 + 5)
    assert log["run_start"][0].timestamp == T0 * 1000
    assert log["init_start"][0].timestamp == (T0 - 5) * 1000
    # the evaluation ended at T0 + 11 after 1 s; the epoch ran up to its start
    assert log["epoch_stop"][0].timestamp == log["eval_start"][0].timestamp == (T0 + 10) * 1000
    assert log["eval_stop"][0].timestamp == (T0 + 11) * 1000
    assert value["eval_accuracy"] == 0.9 and log["eval_accuracy"][0].value["metadata"]["epoch_num"] == 1
    stop = log["run_stop"][0]
    assert stop.value["metadata"]["status"] == "success" and stop.timestamp == (T0 + 11.5) * 1000
    # without recorded data-set sizes, train_samples is what one epoch trained: 50 steps x 64
    assert value["train_samples"] == 3200 and "eval_samples" not in log


def test_a_run_that_missed_the_goal_stops_aborted(store, tmp_path):
    run = record_run(store, workers=1, tta=None)
    log = parse(write_mllog(run, tmp_path / "run.mllog.txt"))
    assert log["run_stop"][0].value["metadata"]["status"] == "aborted"
    assert log["eval_accuracy"][0].value["value"] == 0.5


def test_download_check_runs_the_official_checker_and_fails_with_its_reason(store, tmp_path):
    """`download --format mlperf --check` runs `python -m mlperf_logging.compliance_checker` with
    mlbench's rules: a log without eval_samples (a run that recorded no evaluation set size)
    fails with exit 1 and the checker's reason; one with it passes."""
    missing = record_run(store, workers=2, tta=9.0, wall=10.0)
    proc = mlbench("download", missing.id, "--format", "mlperf", "--check", "-o", str(tmp_path / "a.zip"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "compliance checker rejects" in proc.stderr and "eval_samples" in proc.stderr
    assert "Traceback" not in proc.stderr
    complete = record_run(store, workers=2, tta=9.0, wall=10.0, result_extra={"test_samples": 500})
    proc = mlbench("download", complete.id, "--format", "mlperf", "--check", "-o", str(tmp_path / "b.zip"))
    assert proc.returncode == 0 and "compliance checker passes" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("state", [FAILED, CANCELLED, FINISHED])
def test_a_run_that_ended_before_its_first_evaluation_passes_the_checker_aborted(store, tmp_path, state):
    """A failed or cancelled run, or one its step cap stopped, before any evaluation: the log has
    the epoch it trained and run_stop "aborted", as MLPerf logs an aborted run, and no evaluation."""
    run = record_run(store, workers=2, state=state, evaluated=False)
    proc = mlbench("download", run.id, "--format", "mlperf", "--check", "-o", str(tmp_path / "run.zip"))
    assert proc.returncode == 0 and "compliance checker passes" in proc.stdout, proc.stdout + proc.stderr
    log = parse(tmp_path / "run.mllog.txt")
    assert log["run_stop"][0].value["metadata"]["status"] == "aborted"
    assert "eval_accuracy" not in log and "eval_start" not in log
    # the training up to rank 0's last reading (T0 + 10): 50 steps of 64 samples, in epoch 1
    epoch = log["epoch_stop"][0]
    assert log["epoch_start"][0].timestamp == T0 * 1000 and epoch.timestamp == (T0 + 10) * 1000
    assert epoch.value["metadata"] == {"epoch_num": 1, "samples_count": 3200}
    assert log["train_samples"][0].value["value"] == 3200


def test_a_run_that_cannot_have_a_valid_log_is_refused_in_one_line(store, tmp_path):
    """A run that has not ended has no run_stop, one that recorded no training step no run_start:
    `download --format mlperf` refuses either in one line, exit 2, before it writes anything."""
    early = store.create(task="task1a", workers=2, division="closed", run_json={"task": "task1a"})
    store.update(early.id, state=FAILED, started_at=T0, finished_at=T0 + 3.0, reason="worker 1 exited with code 1")
    proc = mlbench("download", early.id, "--format", "mlperf", "-o", str(tmp_path / "early.zip"))
    assert (proc.returncode, proc.stdout) == (2, "") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"Error: run {early.id} failed before it recorded a training step")
    assert "run_start" in proc.stderr and not list(tmp_path.iterdir())
    running = record_run(store, workers=1, state=RUNNING)
    with pytest.raises(UsageError, match=f"run {running.id} is still running: .*run_stop"):
        write_mllog(running, tmp_path / "running.mllog.txt")
    assert not list(tmp_path.iterdir())


def test_a_rejected_log_says_which_rule_failed_and_why(store, tmp_path):
    """The checker's verdict as one line per failed rule: its file, the key, what failed and the
    rule's reason in words; never the checker's state dumps."""
    run = record_run(store, workers=2, tta=9.0, wall=10.0)  # no evaluation set size recorded
    path = write_mllog(run, tmp_path / "run.mllog.txt")
    path.write_text(path.read_text().replace('"key": "eval_accuracy", "value": 0.9', '"key": "eval_accuracy", '
                                             '"value": 1.5'))
    passed, said = check_mllog(path)
    lines = said.splitlines()
    assert not passed and len(lines) == 2, said
    samples = next(line for line in lines if "eval_samples" in line)
    assert samples.startswith("training.yaml: eval_samples") and "evaluation set's size" in samples, samples
    accuracy = next(line for line in lines if "eval_accuracy" in line)
    assert accuracy.startswith("task1a.yaml: eval_accuracy ") and "0 <= v['value'] <= 1" in accuracy, accuracy
    assert "a fraction from 0 to 1" in accuracy and "context" not in said


def test_every_rule_says_why():
    """Each rule of mlbench's checker files carries its reason (WHY), which a rejection quotes."""
    import yaml

    from mlbench.results.mlperf_rules import RULES_DIR

    for path in sorted(RULES_DIR.glob("*.yaml")):
        for rule in yaml.safe_load(path.read_text()):
            if "KEY" in rule:
                assert rule["KEY"].get("WHY"), (path.name, rule["KEY"]["NAME"])
            if "END" in rule:
                checks = rule["END"]["CHECK"]
                assert len(rule["END"].get("WHY") or []) == len(checks if isinstance(checks, list) else [checks])


@pytest.mark.parametrize("launcher, nodes, here, status", [("local", None, None, "onprem"),
                                                         ("kubernetes", 2, False, "cloud"),
                                                         ("external", 1, False, "cloud")])
def test_the_platform_counts_the_nodes_the_launcher_recorded(store, tmp_path, launcher, nodes, here, status):
    run = record_run(store, workers=8, tta=9.0, wall=10.0, launcher=launcher, nodes=nodes, on_this_machine=here)
    value = {key: lines[0].value["value"] for key, lines in parse(write_mllog(run, tmp_path / "l.txt")).items()}
    assert value["submission_platform"].startswith(f"{nodes or 1}x ")  # a local run: this one machine
    assert f"8 worker(s), {launcher}" in value["submission_platform"]
    assert value["submission_status"] == status


def test_every_task_has_its_rules_and_is_a_benchmark_the_common_rules_accept():
    """A task without its rules file made the checker crash with a traceback (task 5a did)."""
    import yaml

    from mlbench.results.mlperf_rules import COMMON, RULES_DIR
    from mlbench.tasks.registry import TASK_PACKAGES

    rules = {rule["KEY"]["NAME"]: rule["KEY"] for rule in yaml.safe_load(COMMON.read_text()) if "KEY" in rule}
    accepted = rules["submission_benchmark"]["CHECK"]
    for name in TASK_PACKAGES:
        assert (RULES_DIR / f"{name}.yaml").is_file(), name
        assert f"'{name}'" in accepted, (name, accepted)
