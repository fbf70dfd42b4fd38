"""``python -m mlbench.worker.jax_worker RUN_DIR [--rank R]``: one JAX worker of a run.

The JAX implementation of the worker contract (docs/worker-contract.md): the rank, world size
and rendezvous come from ``--rank`` and run.json (or another launcher's environment, as for the
PyTorch worker); the processes meet through ``jax.distributed`` (rank 0 hosts its coordinator at
the run's ``master_addr:master_port``) and all-reduce over gloo on CPUs. It records the same
metric events and heartbeat as the PyTorch worker, and its test set is scored by mlbench's
NumPy scorer (:mod:`mlbench.tasks.scoring`), not by JAX.

The data are mlbench's own: the data set loaders and the order of the samples
(:func:`mlbench.tasks.data.sharding.epoch_batches`) are those the PyTorch worker uses, read on
the CPU and handed to JAX as NumPy arrays, so that both frameworks see the same samples in the
same order. The supervisor starts this module as a fresh interpreter (never forked from its
torch-importing self). Exit codes are the PyTorch worker's: 0 done, 1 failed, 143 stopped.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from mlbench.errors import DivergedError, MlbenchError
from mlbench.results.events import EventWriter, FileSink
from mlbench.results.http_sink import beat_sender, open_sink
from mlbench.results.outcome import TrainingResult
from mlbench.run_config import RunConfig, RunDocument
from mlbench.tasks.classification import ClassificationSettings, learning_rate
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.scoring import TOTALS, metrics_of, score_outputs
from mlbench.worker.heartbeat import SUPERVISED_ENV, Heartbeat
from mlbench.worker.launcher_env import MLBENCH, check_world_size, launcher_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlbench.worker.jax_worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rank", type=int, default=None,
                        help="this worker's rank [from torchrun's, srun's or mpirun's environment]")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    document = RunDocument.load(args.run_dir)
    config = document.config
    try:
        launch = launcher_env(args.rank)
        check_world_size(launch, config.workers, args.run_dir)
    except MlbenchError as err:
        print(f"Error: {err}", file=sys.stderr)
        return err.exit_code
    addr = launch.master_addr or os.environ.get("MLBENCH_MASTER_ADDR") or config.master_addr
    port = launch.master_port or int(os.environ.get("MLBENCH_MASTER_PORT") or config.master_port)
    events = EventWriter(open_sink(args.run_dir, launch.rank, document.id), launch.rank)
    watch_peers = (isinstance(events.sink, FileSink) and launch.source != MLBENCH
                   and not os.environ.get(SUPERVISED_ENV))
    heartbeat = Heartbeat(args.run_dir, launch.rank, config.workers, watchdog_s=config.watchdog_s,
                          watch_peers=watch_peers, on_stall=functools.partial(_stalled_peer, events),
                          send=beat_sender(args.run_dir, document.id)).start()
    try:
        _join(config, launch.rank, f"{addr}:{port}")
        return run_worker(config, launch.rank, events, heartbeat)
    except MlbenchError as err:
        _record_error(events, str(err))
        print(f"Error: {err}", file=sys.stderr)
        return 1
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        traceback.print_exc()
        _record_error(events, f"{type(err).__name__}: {err}".splitlines()[0][:500])
        return 1
    finally:
        heartbeat.stop()
        try:
            events.close()
        except OSError:
            pass


def _join(config: RunConfig, rank: int, coordinator: str) -> None:
    """One CPU device per process; the processes of a run of several meet at the coordinator
    (rank 0 hosts it) and all-reduce over gloo."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if config.workers > 1:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=config.workers,
                                   process_id=rank, local_device_ids=[0],
                                   initialization_timeout=300)


def run_worker(config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None) -> int:
    """Train as rank ``rank`` (after :func:`_join`); record the result (rank 0); return 0.

    Also what the tests call in-process for one worker."""
    from mlbench.results.environment import describe_environment

    loop = JaxTrainer(config, rank, events, heartbeat)
    if rank == 0:
        import jax

        events.emit("environment", {**describe_environment(), "framework": "jax", "jax": jax.__version__},
                    epoch=0, step=0)
    result = loop.train()
    if heartbeat is not None:
        heartbeat.phase("finishing")
    if rank == 0:
        events.emit("result", result.to_dict(), epoch=result.epochs, step=result.steps)
    loop.leave()
    return 0


class JaxTrainer:
    """The training loop of the JAX port: the PyTorch trainer's epochs, step cap, log intervals,
    evaluation and goal, around :class:`mlbench.worker.jax_logreg.LogisticRegressionPort`."""

    def __init__(self, config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None):
        import torch  # mlbench's data loaders and sample order (CPU only)

        from mlbench.tasks.data.sharding import steps_per_epoch
        from mlbench.tasks.datasets import load_splits
        from mlbench.worker.jax_logreg import LogisticRegressionPort

        torch.set_num_threads(1)
        self.cfg, self.rank, self.world = config, rank, config.workers
        self.events, self.heartbeat = events, heartbeat
        self.spec = config.training_spec
        settings = self.spec.settings
        assert isinstance(settings, ClassificationSettings)
        self.settings = settings
        train, test = load_splits(settings.dataset, config.data, config.data_dir, config.seed)
        self.train_x, self.train_y = train.x.numpy(), train.y.numpy()
        self.test_x, self.test_y = test.x.numpy(), test.y.numpy()
        self.port = LogisticRegressionPort(settings, int(self.train_x.shape[1]))
        self.steps_per_epoch = steps_per_epoch(len(self.train_y), self.world, settings.batch_per_worker)
        if self.steps_per_epoch == 0:
            raise MlbenchError(f"the training set has {len(self.train_y)} samples, fewer than one global "
                               f"batch ({self.world} workers x {settings.batch_per_worker})")
        self.metric = get_metric("accuracy")
        #: bytes one rank sends per step in a ring all-reduce of the fp32 gradient
        self.bytes_per_step = int(2 * (self.world - 1) * self.port.num_parameters * 4 / self.world)
        self.step = 0
        self.train_start = 0.0
        self.eval_time = 0.0
        self.best: float | None = None
        self.last: dict[str, float] = {}
        self.goal_at: tuple[int, float, float, float] | None = None

    def train_time(self) -> float:
        return time.perf_counter() - self.train_start - self.eval_time

    def train(self) -> TrainingResult:
        from mlbench.tasks.data.sharding import epoch_batches

        stop_reason, evaluated_at = "max-epochs", -1
        self.train_start = time.perf_counter()
        losses: list[float] = []
        samples = 0
        for epoch in range(self.settings.max_epochs):
            order = epoch_batches(len(self.train_y), workers=self.world, rank=self.rank,
                                  batch_per_worker=self.settings.batch_per_worker, seed=self.cfg.seed,
                                  epoch=epoch).numpy()
            stop = None
            for idx in order:
                if self.cfg.max_steps is not None and self.step >= self.cfg.max_steps:
                    stop = "max-steps"
                    break
                lr = learning_rate(self.settings.lr, workers=self.world,
                                   batch_per_worker=self.settings.batch_per_worker, step=self.step,
                                   steps_per_epoch=self.steps_per_epoch)
                losses.append(self.port.step(self.train_x[idx], self.train_y[idx], lr))
                samples += len(idx)
                self.step += 1
                if self.heartbeat is not None:
                    self.heartbeat.stepped(self.step)
                if len(losses) == self.cfg.log_every:
                    self._log_interval(losses, samples, lr)
                    losses, samples = [], 0
            if losses:
                self._log_interval(losses, samples, lr)
                losses, samples = [], 0
            if stop is not None and evaluated_at == self.step:
                stop_reason = stop
                break
            reached = self.evaluate()
            evaluated_at = self.step
            if stop is not None:
                stop_reason = stop
                break
            if reached and self.cfg.stop_at_goal:
                stop_reason = "goal"
                break
        if evaluated_at != self.step:
            self.evaluate()
        return self._result(stop_reason)

    def _epoch(self) -> float:
        return self.step / self.steps_per_epoch

    def _log_interval(self, losses: list[float], samples: int, lr: float) -> None:
        bad = [i for i, v in enumerate(losses) if not np.isfinite(v)]
        if bad or not np.isfinite(self.port.weights()).all():
            at = self.step - len(losses) + (bad[0] + 1 if bad else len(losses))
            raise DivergedError(f"the training loss or the parameters of rank {self.rank} are not finite at "
                                f"step {at}; the run diverged: lower the learning rate (--set lr...)")
        epoch, step, emit = self._epoch(), self.step, self.events.emit
        emit("train/loss", float(np.mean(losses)), epoch=epoch, step=step)
        emit("train/lr", lr, epoch=epoch, step=step)
        emit("train/steps", len(losses), epoch=epoch, step=step)
        emit("train/samples", samples, epoch=epoch, step=step)
        emit("train/time", self.train_time(), epoch=epoch, step=step)
        emit("comm/bytes", len(losses) * self.bytes_per_step, epoch=epoch, step=step)
        emit("comm/dense_bytes", len(losses) * self.bytes_per_step, epoch=epoch, step=step)

    def evaluate(self) -> bool:
        """Logits of this rank's share of the test set, scored by mlbench's NumPy scorer; the
        sums of all ranks; True at the goal."""
        from mlbench.tasks.data.sharding import eval_shard

        begin = time.perf_counter()
        if self.heartbeat is not None:
            self.heartbeat.phase("evaluation")
        start, stop = eval_shard(len(self.test_y), workers=self.world, rank=self.rank)
        totals = np.zeros(len(TOTALS), np.float64)
        for lo in range(start, stop, self.cfg.eval_batch_size):
            hi = min(stop, lo + self.cfg.eval_batch_size)
            totals += score_outputs(self.settings.loss, self.port.logits(self.test_x[lo:hi]), self.test_y[lo:hi])
        metrics = metrics_of(_sum_over_processes(totals, self.world), self.port.regulariser())
        elapsed = time.perf_counter() - begin
        self.eval_time += elapsed
        epoch, step = self._epoch(), self.step
        self.events.emit("time/eval", elapsed, epoch=epoch, step=step)
        value = metrics[self.metric.name]
        self.last = metrics
        self.best = self.metric.best([v for v in (self.best, value) if v is not None])
        if self.rank == 0:
            for name, number in metrics.items():
                self.events.emit(f"eval/{name}", number, epoch=epoch, step=step)
            self.events.emit("train/time", self.train_time(), epoch=epoch, step=step)
        if self.heartbeat is not None:
            self.heartbeat.phase("training")
        reached = self.metric.reached(value, self.cfg.goal)
        if reached and self.goal_at is None:
            self.goal_at = (step, epoch, self.train_time(), time.perf_counter() - self.train_start)
        return reached

    def _result(self, stop_reason: str) -> TrainingResult:
        goal = self.goal_at
        return TrainingResult(
            goal=self.cfg.goal, light=self.cfg.light, reached=goal is not None, metric=self.metric.name,
            time_to_accuracy=goal[2] if goal else None, wall_time_to_accuracy=goal[3] if goal else None,
            epochs_to_accuracy=goal[1] if goal else None, steps_to_accuracy=goal[0] if goal else None,
            final_accuracy=self.last.get("accuracy"), final_loss=self.last.get("loss"), best_accuracy=self.best,
            train_time=self.train_time(), eval_time=self.eval_time, epochs=self._epoch(), steps=self.step,
            stop_reason=stop_reason, bytes_sent=self.step * self.bytes_per_step,
            train_samples=len(self.train_y), test_samples=len(self.test_y))

    def leave(self) -> None:
        if self.world > 1:
            import jax

            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("mlbench: done")
            jax.distributed.shutdown()


def _sum_over_processes(totals: np.ndarray, world: int) -> np.ndarray:
    """The element-wise float64 sum of every process's ``totals``. JAX computes in float32 here
    (x64 is off), so each value travels as a float32 pair (value, remainder) that restores it to
    about 48 bits, and the sum is taken in NumPy in rank order."""
    if world == 1:
        return totals
    from jax.experimental import multihost_utils

    high = totals.astype(np.float32)
    low = (totals - high.astype(np.float64)).astype(np.float32)
    gathered = np.asarray(multihost_utils.process_allgather(np.stack([high, low])), np.float64)
    return (gathered[:, 0] + gathered[:, 1]).sum(axis=0)


def _stalled_peer(events: EventWriter, reason: str, record: bool) -> None:
    """As the PyTorch worker's: the peers' watchdog found a stalled rank (no supervisor)."""
    message = f"watchdog: {reason}"
    if record:
        _record_error(events, message)
    print(f"Error: {message}", file=sys.stderr, flush=True)
    try:
        events.close()
    except Exception:  # exiting regardless; the log has the reason
        pass
    os._exit(1)


def _record_error(events: EventWriter, message: str) -> None:
    try:
        events.emit("error", message, epoch=0, step=0)
    except OSError as err:
        print(f"could not record the error event: {err}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
