"""The MLPerf :::MLLOG log of a run, read back with the mlperf-logging package's own parser."""

from pathlib import Path

import pytest
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser

from mlbench.results.mllog import write_mllog
from mlbench.results.store import RunStore

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
