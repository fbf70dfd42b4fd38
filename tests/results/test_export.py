"""`mlbench export --to tensorboard|mlflow|wandb` (issue 25, part 2), read back by each tool's own reader.

Three runs: a real 2-worker task2a run on synthetic data (accuracy, per-rank phases and bytes),
a recorded task3a run (perplexity: never an accuracy) and a recorded task0a sweep (bandwidths
by message size). Every number their events hold must come back exactly, under its name:
rank 0's under the event's name, worker r's under ``rank<r>/``; with the summary, the result
and the configuration beside them. TensorBoard's files are read with its EventAccumulator,
MLflow's store with MlflowClient, W&B's offline run with its own protobuf records (the .wandb
file is a LevelDB-style log of ``wandb_internal_pb2.Record``; wandb 0.31 ships no Python
reader of it).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # (registers the commands)
from mlbench.cli import cli
from mlbench.results.events import FileSink, read_run_events
from mlbench.results.exporters import export_runs, tensorboard_without_tensorflow
from mlbench.results.store import FINISHED, RUNNING, RunRecord, RunStore
from mlbench.results.summary import summarize
from tests.helpers import mlbench, requires
from tests.results.recorded import T0, record_run

pytestmark = requires("tensorboard", "mlflow", "wandb")

SWEEP_ROWS = [
    {"dtype": "fp32", "elements": 1, "bytes": 4, "iterations": 20, "time_s": 2.5e-05,
     "algbw_gbps": 0.00016, "busbw_gbps": 0.00016, "wrong": 0},
    {"dtype": "fp32", "elements": 1000, "bytes": 4000, "iterations": 20, "time_s": 4.0e-05,
     "algbw_gbps": 0.1, "busbw_gbps": 0.1, "wrong": 0},
]


def record_sweep(store: RunStore) -> RunRecord:
    """A finished 2-worker task0a run with two sweep rows, written as the workers write them."""
    record = store.create(task="task0a", workers=2, division="closed",
                          run_json={"task": "task0a", "division": "closed", "changed": [],
                                    "config": {"workers": 2, "device": "cpu", "seed": 0}})
    sink = FileSink(record.run_dir, 0)
    for i, row in enumerate(SWEEP_ROWS):
        sink.write({"time": T0 + i, "rank": 0, "epoch": 0, "step": i + 1, "name": "allreduce", "value": row})
    result = {"goal": None, "kind": "allreduce", "backend": "gloo", "device": "cpu", "workers": 2,
              "rows": SWEEP_ROWS, "wrong": 0, "steps": 40, "epochs": 0.0, "train_time": 0.5,
              "eval_time": 0.0, "stop_reason": "sweep complete"}
    sink.write({"time": T0 + 3, "rank": 0, "epoch": 0, "step": 40, "name": "result", "value": result})
    sink.close()
    store.update(record.id, state=FINISHED, started_at=T0, finished_at=T0 + 3, result=result)
    return store.get(record.id)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, RunRecord]:
    home = tmp_path_factory.mktemp("export-store")
    env = {**os.environ, "MLBENCH_HOME": str(home), "MLBENCH_CONFIG_DIR": str(home / "config"),
           "MLBENCH_DATA": str(home / "data")}
    mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "4", "--log-every", "2",
            env=env, timeout=240, check=True)
    store = RunStore(home)
    real = store.list()[0]
    return {"home": home,  # type: ignore[dict-item]
            "task2a": real,
            "task3a": record_run(store, workers=2, task="task3a", goal=90.0, final=915.69),
            "task0a": record_sweep(store)}


def expected_series(record: RunRecord) -> dict[str, list[tuple[int, float]]]:
    """Tag -> sorted (step, value) of every number the run's events hold, as recorded."""
    series = defaultdict(list)
    for e in read_run_events(record.run_dir):
        name = e["name"]
        if name.split("/")[0] in ("train", "time", "eval", "comm", "sys"):
            series[name if e["rank"] == 0 else f"rank{e['rank']}/{name}"].append((e["step"], e["value"]))
        elif name == "allreduce":
            row = e["value"]
            for key, tag in (("busbw_gbps", "busbw_gbps"), ("algbw_gbps", "algbw_gbps")):
                series[f"allreduce/{row['dtype']}/{tag}"].append((row["bytes"], row[key]))
            series[f"allreduce/{row['dtype']}/time_us"].append((row["bytes"], 1e6 * row["time_s"]))
    return {tag: sorted(points) for tag, points in series.items()}


def expected_summary(record: RunRecord) -> dict[str, float]:
    """The figures every tool must hold beside the series (a few, checked exactly)."""
    if record.task == "task0a":
        return {"result/peak_bus_bandwidth_gbps": 0.1, "result/latency_us": 1e6 * 2.5e-05}
    if record.task == "task3a":
        return {"result/final_perplexity": 915.69, "result/goal_perplexity": 90.0,
                "summary/throughput_samples_per_s": 2000 / 10.0}
    summary = summarize(read_run_events(record.run_dir))
    return {"result/final_accuracy": record.result["final_accuracy"],
            "summary/throughput_samples_per_s": summary.throughput,
            "summary/time_communication_max_s": summary.phase_stat("communication", "max")}


def check_names(record: RunRecord, series: dict) -> None:
    """The goal metric under its own name; per-rank series for every worker."""
    if record.task == "task3a":
        assert "eval/perplexity" in series and not any("accuracy" in tag for tag in series)
    if record.task == "task2a":
        assert "eval/accuracy" in series and "rank1/time/communication" in series and "rank1/comm/bytes" in series
        assert "sys/rss_bytes" in series and "rank1/sys/cpu_percent" in series  # each interval's memory and CPU
    if record.task == "task0a":
        assert [s for s, _ in series["allreduce/fp32/busbw_gbps"]] == [4, 4000]


# -- each tool's own reader --------------------------------------------------------------------
def read_tensorboard(folder: Path) -> tuple[dict, dict, dict]:
    """(series, last value by tag, hparams) from the run's event files, read as tensorboard
    without TensorFlow reads them (its stub, as the exporter writes them: importing TensorFlow
    for the files cost the test's process 5 CPU-seconds)."""
    tensorboard_without_tensorflow()
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(folder), size_guidance={TENSORS: 0})
    acc.Reload()
    series = {}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue  # the note (text), the hparams
        series[tag] = sorted((e.step, make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag))
    content = next(iter(acc.PluginTagToContent("hparams").values()))
    data = HParamsPluginData.FromString(content)
    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
               for k, v in data.session_start_info.hparams.items()}
    return series, {t: p[-1][1] for t, p in series.items()}, hparams


def read_mlflow(folder: Path, run_id: str) -> tuple[dict, dict, dict]:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=folder.resolve().as_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments, filter_string=f"tags.`mlbench.run_id` = '{run_id}'")
    series = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
              for key in run.data.metrics}
    assert run.info.status == "FINISHED"
    return series, dict(run.data.metrics), dict(run.data.params)


def wandb_records(path: Path) -> list:
    """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then 32 KiB
    blocks of LevelDB log chunks (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        left = block - offset % block
        if left < 7:
            offset += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def read_wandb(folder: Path, run_id: str) -> tuple[dict, dict, dict]:
    (run_dir,) = (folder / "wandb").glob(f"offline-run-*-{run_id}")
    series: dict[str, list] = defaultdict(list)
    summary, config = {}, {}
    for record in wandb_records(run_dir / f"run-{run_id}.wandb"):
        which = record.WhichOneof("record_type")
        if which == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            axis = "allreduce/bytes" if "allreduce/bytes" in row else "step"
            for key, value in row.items():
                if key != axis and not key.startswith("_"):
                    series[key].append((row[axis], value))
        elif which == "summary":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.summary.update})
        elif which == "config":
            config.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                           for item in record.config.update})
        elif which == "run":
            summary.update({item.key: json.loads(item.value_json) for item in record.run.summary.update})
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    return {k: sorted(v) for k, v in series.items()}, summary, config


READERS = {
    "tensorboard": lambda folder, run_id: read_tensorboard(folder / run_id),
    "mlflow": read_mlflow,
    "wandb": read_wandb,
}


@pytest.mark.parametrize("tool", ["tensorboard", "mlflow", "wandb"])
def test_every_recorded_number_reads_back_exactly(runs, tool, tmp_path):
    records = [runs["task2a"], runs["task3a"], runs["task0a"]]
    locations = export_runs(records, tool, tmp_path / tool)
    assert len(locations) == 3
    for record in records:
        series, last, hparams = READERS[tool](tmp_path / tool, record.id)
        want = expected_series(record)
        check_names(record, want)
        # every recorded series, value for value (the summary's own series come beside them)
        assert {tag: series.get(tag) for tag in want} == want, f"{tool} {record.task}"
        for tag, value in expected_summary(record).items():
            assert last[tag] == value, f"{tool} {record.task} {tag}"
        workers = hparams["config.workers"]
        assert workers in (2, "2"), hparams
        assert hparams.get("task") == record.task
        if record.task == "task3a":
            assert hparams.get("mlbench.goal_metric", "eval/perplexity") == "eval/perplexity"


def test_export_cli_errors_are_one_line(runs, tmp_path, monkeypatch):
    env = {"MLBENCH_HOME": str(runs["home"])}
    runner = CliRunner()
    unknown = runner.invoke(cli, ["export", "nosuchrun", "--to", "tensorboard", str(tmp_path / "tb")], env=env)
    assert unknown.exit_code == 2 and unknown.output.count("\n") == 1 and "no run 'nosuchrun'" in unknown.output

    run_id = runs["task3a"].id
    first = runner.invoke(cli, ["export", run_id, "--to", "tensorboard", str(tmp_path / "tb")], env=env)
    assert first.exit_code == 0, first.output
    again = runner.invoke(cli, ["export", run_id, "--to", "tensorboard", str(tmp_path / "tb")], env=env)
    assert again.exit_code == 2 and again.output.count("\n") == 1 and "exists already" in again.output
    assert len(list((tmp_path / "tb" / run_id).iterdir())) == 1  # the first export, untouched

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    missing = runner.invoke(cli, ["export", run_id, "--to", "wandb", str(tmp_path / "wb")], env=env)
    assert missing.exit_code == 1 and missing.output.count("\n") == 1, missing.output
    assert "pip install 'mlbench-suite[wandb]'" in missing.output and not (tmp_path / "wb").exists()


def test_a_run_that_has_not_ended_is_refused(tmp_path):
    store = RunStore()
    active = record_run(store, workers=1, task="task1a", state=RUNNING)
    result = CliRunner().invoke(cli, ["export", active.id, "--to", "mlflow", str(tmp_path / "ml")])
    assert result.exit_code == 2 and "still running" in result.output and not (tmp_path / "ml").exists()


EXPORT_THEN_COUNT = """
import sys, time
from pathlib import Path
import torch
from mlbench.results.export import Point, RunHead
from mlbench.results.exporters import TensorBoardWriter
from mlbench.tasks.flops import counted_flops
from mlbench.results.report import task_metric
head = RunHead(id="abcd1234", name="n", task="task2a", state="finished", started_at=time.time(), group_id=None,
               metric=task_metric("task2a"), goal_tag="light", hparams={"lr": 0.1})
writer = TensorBoardWriter(Path(sys.argv[1]), head)
writer.write([Point("train/loss", 0.5, 1, time.time())])
writer.finish({}, 1, "finished", time.time())
print("tensorflow imported:", "tensorflow" in sys.modules)
print(counted_flops(torch.nn.Linear(4, 2), torch.zeros(1, 4), 3))
"""


@requires("tensorflow")
def test_an_export_to_tensorboard_does_not_import_tensorflow_and_can_count_flops_after(tmp_path):
    """With TensorFlow installed, tensorboard's file access imported all of it (4.6 CPU-seconds
    of every export, and of rank 0 of a run logged live with `run --log-to`), and TensorFlow's
    LLVM then made a load of torch's flop counter (triton's LLVM) in the same process crash it
    with SIGSEGV: a PyTorch worker logging live counts its step's FLOPs. The exporter has
    tensorboard use its TensorFlow-free stub; its files are read back by tensorboard's reader.
    Run apart, as a crash would take pytest's process with it."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", EXPORT_THEN_COUNT, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tensorflow imported: False" in proc.stdout.splitlines()
    # a step: the forward and twice its FLOPs backward, 2 FLOPs per multiply-add of batch x in x out
    assert int(proc.stdout.strip().splitlines()[-1]) == 3 * 2 * 3 * 4 * 2
    series, _, hparams = read_tensorboard(tmp_path / "abcd1234")
    assert series["train/loss"] == [(1, 0.5)] and hparams["lr"] == 0.1


EXPORT_IN_A_TENSORFLOW_PROCESS = """
import sys, time
from pathlib import Path
from mlbench.tasks.flops import load_flop_counter
load_flop_counter()   # as a TensorFlow worker does, before TensorFlow
import tensorflow
from mlbench.results.export import RunHead
from mlbench.results.exporters import TensorBoardWriter
from mlbench.results.report import task_metric
head = RunHead(id="abcd1234", name="n", task="task2a", state="finished", started_at=time.time(), group_id=None,
               metric=task_metric("task2a"), goal_tag="light")
TensorBoardWriter(Path(sys.argv[1]), head).finish({}, 0, "finished", time.time())
from tensorboard.compat import tf2
print("tensorboard's TensorFlow 2 API:", tf2.summary.write is tensorflow.summary.write)
"""


@requires("tensorflow")
def test_an_export_in_a_process_with_tensorflow_leaves_tensorboard_its_tensorflow(tmp_path):
    """A TensorFlow worker logging live to TensorBoard has TensorFlow loaded already: the exporter
    does not switch tensorboard to its stub there, so that tensorboard's TensorFlow 2 summaries
    (which the stub lacks) still work in that process."""
    import subprocess

    proc = subprocess.run([sys.executable, "-c", EXPORT_IN_A_TENSORFLOW_PROCESS, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "tensorboard's TensorFlow 2 API: True", proc.stdout


@pytest.mark.parametrize("tool", ["tensorboard", "mlflow", "wandb"])
def test_a_restarted_runs_faults_read_back_as_points_at_their_steps_and_in_its_summary(runs, tool, tmp_path):
    """A recorded task1a run killed once (rank 1 at 30 s, after its last logged step, 50) and
    restarted from step 25: the kill at step 51 and the restart at step 25, each a count so far
    (``timeline/``), and what the faults cost beside the summary (``faults/``); the same in
    every tool."""
    from mlbench.results.goodput import run_faults

    store = RunStore(runs["home"])  # type: ignore[arg-type]
    record = record_run(store, workers=2, tta=9.0, wall=10.0, inject=("kill:rank=1,every=90s",),
                        on_failure="restart", restarts=({"lost_steps": 7, "from_step": 25, "recovered_s": 1.5},))
    faults = run_faults(record, summarize(read_run_events(record.run_dir)))
    export_runs([record], tool, tmp_path / tool)
    series, last, _ = READERS[tool](tmp_path / tool, record.id)
    assert series["timeline/faults"] == [(51, 1)] and series["timeline/restarts"] == [(25, 1)], series
    assert last["faults/restarts"] == 1 and last["faults/redone_steps"] == 7 and last["faults/applied"] == 1
    assert last["faults/recovery_s"] == 1.5
    assert last["faults/goodput"] == pytest.approx(faults["goodput"]) and 0 < faults["goodput"] < 1
