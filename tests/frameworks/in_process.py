"""A worker's training loop run in the test's own process, its events kept in a list: how the
ports' equivalence tests train PyTorch's worker and a port's from the same RunConfig (one import
of each framework per test process, no worker process where the subject is not the processes)."""

from __future__ import annotations

import numpy as np

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from tests.helpers import ListSink

#: task 2a's bound, the JAX and the TensorFlow port's (why: test_jax_port.py's docstring)
RTOL, ATOL = 1e-5, 1e-6


def values(recorded, name, rank=0):
    return np.array([e["value"] for e in recorded if e["name"] == name and e["rank"] == rank])


def train_pytorch_in_process(config: RunConfig) -> list[dict]:
    """The events of the PyTorch worker's loop (``Trainer``) on one process."""
    from mlbench.worker.trainer import Trainer

    sink = ListSink()
    trainer = Trainer(config, 0, EventWriter(sink, 0))
    trainer.setup()
    trainer.train()
    return sink.events


def train_jax_in_process(config: RunConfig) -> list[dict]:
    """The events of the JAX worker's loop (``JaxTrainer``) on one process."""
    from mlbench.worker.jax_worker import JaxTrainer, _join

    import torch

    _join(config, 0, "")
    sink = ListSink()
    threads = torch.get_num_threads()
    JaxTrainer(config, 0, EventWriter(sink, 0)).train()
    # a port trained in the test's process leaves torch's threads as it found them (a worker
    # process sets its one data-loading thread in its entry, worker_main)
    assert torch.get_num_threads() == threads
    return sink.events


def one_tensorflow_thread(tf) -> None:
    """TensorFlow in the test's process computes on one thread, as a worker of a run does (its
    launcher's OMP_NUM_THREADS): with a pool per core, its idle threads spin for work that waits
    for a core on the loaded CI box. Called where a module imports TensorFlow, before anything
    starts it (its thread counts are fixed then; a later call in the same process is a no-op)."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:   # already started by an earlier module's test, which set them
        pass


def train_tf_in_process(config: RunConfig) -> list[dict]:
    """The events of the TensorFlow worker's loop (``TfTrainer``) on one process."""
    from mlbench.worker.tf_worker import TfTrainer, join

    join(config, 0, "")
    sink = ListSink()
    TfTrainer(config, 0, EventWriter(sink, 0)).train()
    return sink.events


def newest_system(events) -> dict:
    """A worker's newest ``system`` event (one per logging interval, one more at the end): the
    one that counts. Checks that its steps are those of the worker's last event."""
    records = [e for e in events if e["name"] == "system"]
    assert len(records) >= 2 and records[-1]["step"] == max(e["step"] for e in events)
    assert [r["value"]["steps"] for r in records] == [r["step"] for r in records]
    return records[-1]["value"]


def check_port_system(port_events, torch_events, steps):
    """A port's ``system`` event of task 2a is the PyTorch worker's: the same analytic FLOPs of the
    step, the CPU's probed peak, peak memory; `status RUN`'s numbers follow from it (wall-clock steps)."""
    from mlbench.results.summary import summarize
    from mlbench.results.sysmetrics import WALL, system_metrics

    port, torch_record = newest_system(port_events), newest_system(torch_events)
    assert port["flops_per_step"] == torch_record["flops_per_step"] == 4 * 100 * 40  # B = 100, the 40 features
    assert (port["flops_method"], port["peak_source"], port["device"], port["steps"]) == \
        ("analytic", "gemm probe", "cpu", steps)
    assert port["peak_flops"] > 0 and port["peak_rss_bytes"] > 0 and port["cuda_peak_bytes"] is None
    # probed at start and after training, the better one the peak
    assert len(port["peak_probes"]) == len(torch_record["peak_probes"]) == 2
    assert port["peak_flops"] == max(port["peak_probes"])
    # each logging interval's memory and CPU, as the PyTorch worker records them
    for name in ("sys/rss_bytes", "sys/cpu_percent"):
        logged = [e["step"] for e in port_events if e["name"] == "train/loss"]
        assert [e["step"] for e in port_events if e["name"] == name] == logged, name
        assert [e["step"] for e in torch_events if e["name"] == name] == logged, name
    metrics = system_metrics(summarize(port_events))
    assert metrics is not None and metrics.step_basis == WALL and metrics.slowest_rank == 0
    assert metrics.step_median == port["train_time"] / steps
    assert metrics.achieved_flops == port["flops_per_step"] * steps / port["train_time"]
    assert metrics.utilisation == metrics.achieved_flops / port["peak_flops"]


def check_saved_weights(trainer_class, join, data_dir, folder) -> None:
    """A port's ``--save-model`` file after 10 steps of task 2a on one process (``trainer_class``
    after the framework's ``join``): mlbench's PyTorch model takes it (strict: every name, every
    shape) and then computes the port's logits on the test set's first 64 samples, to float32
    rounding."""
    import torch

    from mlbench.tasks.models import build_model
    from mlbench.tasks.overrides import resolve
    from mlbench.tasks.task2a import TASK2A

    spec, _ = resolve(TASK2A, {})
    config = RunConfig(task=spec, workers=1, data_dir=str(data_dir), max_steps=10, log_every=5,
                       stop_at_goal=False, save_model=True)
    join(config, 0, "")
    trainer = trainer_class(config, 0, EventWriter(ListSink(), 0))
    trainer.train()

    path = trainer.save_model(folder)
    assert path == folder / "checkpoints" / f"rank-{trainer.rank}.pt"
    model = build_model(trainer.settings.model, in_features=trainer.data.num_features)
    model.load_state_dict(torch.load(path), strict=True)
    x, _ = trainer.data.test_batch(0, 64)
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    assert np.abs(expected).max() > 0   # trained: zero weights give zero logits
    np.testing.assert_allclose(trainer.port.logits(x.numpy()), expected, rtol=1e-5, atol=1e-6)


def check_measured_bytes(recorded, run) -> None:
    """A port's two-worker run reports what its sockets sent: each interval at least the ring
    all-reduce of its gradients (comm/dense_bytes, the reference's count), and at most twice it
    plus 2 KB a step for the framework's framing and the loss's own reduction (40 features,
    160 bytes a step: measured 736 for JAX over gloo, 697-988 for TensorFlow over gRPC; 2,000
    features: 1.07x and 1.09x), never the formula itself; the result's total is their sum."""
    for rank in (0, 1):
        sent = [e["value"] for e in recorded if e["name"] == "comm/bytes" and e["rank"] == rank]
        dense = [e["value"] for e in recorded if e["name"] == "comm/dense_bytes" and e["rank"] == rank]
        assert len(sent) == len(dense) > 0 and all(d > 0 for d in dense)
        steps = [e["value"] for e in recorded if e["name"] == "train/steps" and e["rank"] == rank]
        assert all(d <= s <= 2 * d + 2048 * k for s, d, k in zip(sent, dense, steps, strict=True)), (sent, dense)
        assert sent != dense, "comm/bytes is the formula's, not measured"
    assert run.result["bytes_sent"] == sum(e["value"] for e in recorded if e["name"] == "comm/bytes" and e["rank"] == 0)


def check_phases_said(run, title: str) -> None:
    """A port's run says in `status RUN` and its JSON that its phases are not measured, instead
    of a table of zeros (its step is one compiled program)."""
    import json
    import os
    from pathlib import Path

    from tests.helpers import mlbench

    env = dict(os.environ, MLBENCH_HOME=str(Path(run.run_dir).parent.parent))   # the run's own store
    note = (f"not measured: a {title} step is one compiled program, whose all-reduce cannot be timed apart "
            "(the step time is the wall clock's)")
    shown = mlbench("status", run.id, env=env, check=True).stdout
    assert f"Time per phase: {note}." in shown and "share of step" not in shown, shown
    document = json.loads(mlbench("status", run.id, "-o", "json", env=env, check=True).stdout)
    assert document["summary"]["phases_note"] == note
