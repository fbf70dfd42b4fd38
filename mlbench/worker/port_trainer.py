"""What every port of a task to another framework shares (docs/worker-contract.md): the worker's
start and end (:func:`worker_main`) and the training loop (:class:`PortTrainer`).

A port trains the closed division's algorithm in its framework; everything around the steps is
mlbench's and the same for every framework, so that two ports differ only in how they compute:
the data (mlbench's loaders and :class:`mlbench.tasks.pipeline.Pipeline`, whose images get
the PyTorch worker's crop/flip augmentation drawn per (seed, epoch), computed on the CPU by
mlbench's torch code and handed over as NumPy arrays: the benchmark's data, not the framework
under test), the order of the samples (:func:`mlbench.tasks.data.sharding.epoch_batches`), the
initial weights (those mlbench's PyTorch model draws for the run's seed, handed over as NumPy
arrays by :meth:`PortTrainer.reference_state`), the learning-rate rule, the log intervals, the
evaluation (the port's logits scored by :mod:`mlbench.tasks.scoring` in NumPy), the goal, the
events and the result. Exit codes are the PyTorch worker's: 0 done, 1 failed, 4 failed for good, 143 stopped.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from mlbench.errors import DivergedError, MlbenchError
from mlbench.extras import install_hint
from mlbench.frameworks import FRAMEWORKS
from mlbench.results.events import EventWriter, FileSink
from mlbench.results.http_sink import beat_sender, open_sink
from mlbench.results.outcome import TrainingResult
from mlbench.run_config import RunConfig, RunDocument
from mlbench.tasks.classification import ClassificationSettings, learning_rate
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.scoring import TOTALS, metrics_of, score_outputs
from mlbench.worker.failures import stalled_peer, worker_failed
from mlbench.worker.heartbeat import SUPERVISED_ENV, Heartbeat
from mlbench.worker.launcher_env import MLBENCH, check_world_size, launcher_env

if TYPE_CHECKING:
    from mlbench.worker.sysmetrics import DevicePeak


class PortModel(Protocol):
    """A port's model with its optimizer state: what :class:`PortTrainer` asks of it. Its
    training step is one of two kinds: :class:`TakesMinibatches` or :class:`HoldsTrainingSet`."""

    @property
    def num_parameters(self) -> int: ...

    def sync_statistics(self) -> None:
        """Before an evaluation: make the model's running statistics (BatchNorm's) the same on
        every process, as the PyTorch worker does (their mean); nothing for a model without."""
        ...

    def weights(self) -> np.ndarray:
        """This process's copy of the parameters (every process holds the same)."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """This process's parameters and running statistics under the PyTorch model's names, in
        its layouts (what its ``load_state_dict`` takes, less ``num_batches_tracked``)."""
        ...

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits of ``x``, computed by the framework (no collective)."""
        ...

    def regulariser(self) -> float:
        """The objective's L2 term in float64 (the evaluation's)."""
        ...


@runtime_checkable
class TakesMinibatches(Protocol):
    """A port handed each step's minibatch, made by mlbench's data pipeline (images augmented
    and normalised: task 1a's ports)."""

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One synchronous step on this process's minibatch (images as float32 [N, 3, H, W],
        PyTorch's layout, augmented and normalised); this process's loss."""
        ...

    def warm_up(self, x: np.ndarray, y: np.ndarray) -> None:
        """Compile :meth:`step` for minibatches of ``x``'s and ``y``'s shapes and types: a step
        (with its collective: every process warms up) whose results are dropped, so that the
        weights, the optimizer's state and the running statistics are as they were before."""
        ...


@runtime_checkable
class HoldsTrainingSet(Protocol):
    """A port of a task without augmentation (task 2a) that holds the training set and is
    handed only each step's row indices, gathered inside its compiled program (the JAX and the
    TensorFlow port). One call runs several steps: the steps up to the next log line (see
    :func:`step_runs`), as JAX's ``lax.scan`` and Keras' ``steps_per_execution`` run them, since
    a call's dispatch costs more than a step of this size."""

    def hold_training_set(self, x: np.ndarray, y: np.ndarray) -> None: ...

    def step_rows(self, idx: np.ndarray, lrs: np.ndarray) -> Any:
        """``len(lrs)`` synchronous steps, step ``s`` on the rows ``idx[s]`` (int [steps, batch])
        at the rate ``lrs[s]``; this process's ``steps`` losses (the framework's array of them,
        any shape, read when they are logged), bit for bit those of one call per step."""
        ...

    def warm_up_rows(self, steps: int, batch: int) -> None:
        """Compile :meth:`step_rows` for ``steps`` steps of ``batch`` rows: a call whose results
        are dropped, as :meth:`TakesMinibatches.warm_up`'s."""
        ...


def step_runs(first_step: int, steps_in_epoch: int, log_every: int, max_steps: int | None) -> list[int]:
    """The lengths of the runs of steps one epoch is trained in, from the run's step
    ``first_step`` on: a run ends where a log line is written (every ``log_every`` steps of the
    epoch, and at its end) and at ``max_steps``. What the run logs and computes is as with one
    step at a time; only the calls are fewer."""
    left = steps_in_epoch if max_steps is None else min(steps_in_epoch, max(0, max_steps - first_step))
    runs = [log_every] * (left // log_every)
    return runs + [left % log_every] if left % log_every else runs


def worker_main(module: str, join: Callable[[RunConfig, int, str], Any],
                train: Callable[[RunConfig, int, EventWriter, Heartbeat, Any, Path], int],
                argv: list[str] | None = None) -> int:
    """``python -m MODULE RUN_DIR [--rank R]``: the worker contract's start and end around a
    port's ``join`` (meet the other processes at rank 0's ``host:port``; it returns what
    ``train`` needs of the group, if anything) and ``train`` (its exit code): the rank, the
    heartbeat, the events, and one recorded line for a failure."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
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
                          watch_peers=watch_peers, on_stall=functools.partial(stalled_peer, events),
                          send=beat_sender(args.run_dir, document.id)).start()
    import torch  # before the framework (TensorFlow after torch: see tf_worker)

    # torch only loads and augments the data for the framework, which has the cores
    torch.set_num_threads(1)
    try:
        check_installed(module)
        group = join(config, launch.rank, f"{addr}:{port}")
        return train(config, launch.rank, events, heartbeat, group, args.run_dir)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        return worker_failed(events, err)
    finally:
        heartbeat.stop()
        try:
            events.close()
        except OSError:
            pass


def check_installed(module: str) -> None:
    """MlbenchError naming the pip extra and the image variant when the framework of the port
    whose worker module is ``module`` is not installed here: a cluster's image without it (the
    CLI checks its own Python before a local or Slurm run is recorded, not an image's)."""
    framework = next((f for f in FRAMEWORKS.values() if f.worker == module), None)
    if framework is not None and framework.extra and not framework.installed():
        raise MlbenchError(f"this worker's Python has no {framework.title} ({install_hint(framework.extra)}); "
                           f"on a cluster, run the image `mlbench image build --framework {framework.name}` "
                           "builds, or pass --image with one that has it")


def import_ports(framework: str) -> None:
    """Import the framework's port of every task it has one of (a supervisor's preload, before
    it forks the ranks)."""
    import importlib

    from mlbench.frameworks import FRAMEWORKS

    record = FRAMEWORKS[framework]
    for task in record.tasks or ():
        importlib.import_module(record.port_module(task))


class PortTrainer:
    """The training loop of a port: the PyTorch trainer's epochs, step cap, log intervals,
    evaluation and goal, around the framework's model (:meth:`make_model`); a framework's
    subclass says how its processes add up the evaluation's sums and how they part."""

    #: the framework's name (:data:`mlbench.frameworks.FRAMEWORKS`), whose port of the task trains
    framework: ClassVar[str]

    def __init__(self, config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None):
        import torch  # mlbench's data loaders, augmentation, sample order and initial weights (CPU only)

        from mlbench.tasks.data.sharding import steps_per_epoch
        from mlbench.tasks.datasets import get_dataset, load_splits
        from mlbench.tasks.models import build_model
        from mlbench.tasks.pipeline import Pipeline

        self.cfg, self.rank, self.world = config, rank, config.workers
        self.events, self.heartbeat = events, heartbeat
        self.spec = config.training_spec
        settings = self.spec.settings
        assert isinstance(settings, ClassificationSettings)
        self.settings = settings
        images = get_dataset(settings.dataset).images
        train, test = load_splits(settings.dataset, config.data, config.data_dir, config.seed)
        self.data = Pipeline(train, test, torch.device("cpu"), images=images)
        # the PyTorch worker's model for the run's seed (SupervisedRuntime draws it the same way):
        # every port starts from its weights, and its FLOPs are counted on it
        torch.manual_seed(config.seed)
        self.reference = build_model(settings.model, in_features=None if images else self.data.num_features)
        self.port = self.make_model(settings, self.data.num_features)
        # the system metrics' constants, as the PyTorch worker's (mlbench.worker.sysmetrics): the
        # CPU's peak probed with the run's threads before the training loads the cores, and the
        # FLOPs of a step
        self.device_peak = self._probe_peak(config.threads_per_worker)
        self.step_flops = self.flops_per_step()
        self.steps_per_epoch = steps_per_epoch(self.data.num_train, self.world, settings.batch_per_worker)
        if self.steps_per_epoch == 0:
            raise MlbenchError(f"the training set has {self.data.num_train} samples, fewer than one global "
                               f"batch ({self.world} workers x {settings.batch_per_worker})")
        self.metric = get_metric("accuracy")
        #: bytes one rank sends per step in a ring all-reduce of the fp32 gradient: the reference's
        #: (comm/dense_bytes); what the port sent is measured on its sockets (comm/bytes, :attr:`wire`)
        self.bytes_per_step = int(2 * (self.world - 1) * self.port.num_parameters * 4 / self.world)
        from mlbench.worker.wire import WireCounter

        self.wire = WireCounter()
        self.bytes_sent = 0
        self.step = 0
        self.train_start = 0.0
        self.eval_time = 0.0
        self.best: float | None = None
        self.last: dict[str, float] = {}
        self.goal_at: tuple[int, float, float, float] | None = None

    @staticmethod
    def _probe_peak(threads: int) -> DevicePeak:
        """The CPU's peak FLOP/s by the PyTorch worker's GEMM probe (the ports compute in float32
        on CPUs), with the run's threads; torch's own count is restored after (a worker keeps
        one for the data loaders: :func:`worker_main`)."""
        import torch

        from mlbench.worker.sysmetrics import DevicePeak

        before = torch.get_num_threads()
        torch.set_num_threads(max(1, threads))
        try:
            return DevicePeak.of(torch.device("cpu"), "fp32")
        finally:
            torch.set_num_threads(before)

    def reference_state(self) -> dict[str, np.ndarray]:
        """The PyTorch model's initial state for the run's seed (parameters and buffers, by
        their PyTorch names, in PyTorch's layouts), the start of every port."""
        return {name: value.detach().numpy().copy() for name, value in self.reference.state_dict().items()}

    def flops_per_step(self) -> tuple[int, str] | None:
        """FLOPs of this process's step and how they were counted (:mod:`mlbench.tasks.flops`),
        as the PyTorch worker counts them for the same model: task 2a's logistic regression
        ``4 B D`` analytic, another model by torch's flop counter on the PyTorch model."""
        from mlbench.tasks.flops import ANALYTIC, FLOP_COUNTER, counted_flops, logistic_regression_flops
        from mlbench.tasks.task2a.model import LogisticRegression

        batch = self.settings.batch_per_worker
        if isinstance(self.reference, LogisticRegression):
            return logistic_regression_flops(batch, self.reference.in_features), ANALYTIC
        sample, _ = self.data.test_batch(0, 1)
        return counted_flops(self.reference, sample, batch), FLOP_COUNTER

    def make_model(self, settings: ClassificationSettings, in_features: int) -> PortModel:
        """The framework's model, its optimizer state and its synchronous step: the ``make_port``
        of the framework's module in the task's package (:meth:`Framework.port_module`)."""
        import importlib

        from mlbench.frameworks import FRAMEWORKS

        module = importlib.import_module(FRAMEWORKS[self.framework].port_module(self.cfg.task.name))
        port: PortModel = module.make_port(settings, in_features, self.reference_state, **self.port_context())
        return port

    def port_context(self) -> dict[str, Any]:
        """What the framework's ``make_port`` takes besides the settings (TensorFlow: the strategy)."""
        return {}

    def sum_over_processes(self, totals: np.ndarray) -> np.ndarray:
        """The element-wise float64 sum of every process's ``totals``, the same on every process."""
        raise NotImplementedError

    def save_model(self, run_dir: Path) -> Path:
        """``--save-model``: this rank's final weights as the PyTorch worker saves its own, a
        state dict of torch tensors in ``RUN_DIR/checkpoints/rank-<r>.pt`` under the PyTorch
        model's names, layouts and order, so that ``load_state_dict`` of mlbench's model takes
        it; BatchNorm's ``num_batches_tracked`` counts the training steps, as PyTorch's would."""
        import torch

        state = self.port.state_dict()
        whole: dict[str, torch.Tensor] = {}
        for name, reference in self.reference.state_dict().items():
            if name.endswith(".num_batches_tracked"):
                whole[name] = torch.tensor(self.step, dtype=reference.dtype)
            else:
                whole[name] = torch.from_numpy(np.array(state[name], copy=True)).to(reference.dtype)
        folder = run_dir / "checkpoints"
        folder.mkdir(exist_ok=True)
        path = folder / f"rank-{self.rank}.pt"
        torch.save(whole, path)
        return path

    def leave(self) -> None:
        """Wait for the other processes and leave the framework's group (several workers)."""

    def train_time(self) -> float:
        return time.perf_counter() - self.train_start - self.eval_time

    def train(self) -> TrainingResult:
        import torch

        from mlbench.tasks.data.sharding import epoch_batches
        from mlbench.worker.sysmetrics import IntervalSampler

        stop_reason, evaluated_at = "max-epochs", -1
        num_train = self.data.num_train
        # a port that holds the training set (task 2a's vectors: no augmentation) is handed only
        # each step's row indices; images go through mlbench's augmentation every step
        rows = self.port if not self.data.images and isinstance(self.port, HoldsTrainingSet) else None
        minibatches = self.port if isinstance(self.port, TakesMinibatches) else None
        if rows is not None:
            rows.hold_training_set(self.data.train.x.numpy(), self.data.train.y.numpy())
        elif minibatches is None:
            raise TypeError(f"{type(self.port).__name__} takes neither minibatches nor row indices")
        self.compile_step(rows, minibatches)
        self.train_start = time.perf_counter()
        self.wire.restart()   # the warm-up step's all-reduce and the processes' meeting are no training
        self.sys_sampler = IntervalSampler(torch.device("cpu"))  # the sys/ events of each interval, as PyTorch's
        losses: list[Any] = []   # floats, or the framework's scalars or vectors, read when logged
        samples = pending = 0
        for epoch in range(self.settings.max_epochs):
            self.data.begin_epoch(self.cfg.seed, epoch)
            order = epoch_batches(num_train, workers=self.world, rank=self.rank,
                                  batch_per_worker=self.settings.batch_per_worker, seed=self.cfg.seed,
                                  epoch=epoch)
            runs = step_runs(self.step, len(order), self.cfg.log_every, self.cfg.max_steps)
            if rows is None:
                runs = [1] * sum(runs)   # a minibatch port: one call a step
            begin = 0
            for steps in runs:
                idx = order[begin:begin + steps]
                lrs = np.array([self.learning_rate(self.step + s) for s in range(steps)])
                lr = float(lrs[-1])
                if rows is not None:
                    losses.append(rows.step_rows(idx.numpy(), lrs))
                else:
                    assert minibatches is not None
                    x, y = self.data.train_batch(idx[0])
                    losses.append(minibatches.step(x.numpy(), y.numpy(), float(lrs[0])))
                begin += steps
                pending += steps
                samples += idx.numel()
                self.step += steps
                if self.heartbeat is not None:
                    self.heartbeat.stepped(self.step, steps=steps)
                if pending == self.cfg.log_every:
                    self._log_interval(losses, samples, lr)
                    losses, samples, pending = [], 0, 0
            stop = "max-steps" if begin < len(order) else None   # stopped inside the epoch
            if losses:
                self._log_interval(losses, samples, lr)
                losses, samples, pending = [], 0, 0
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
        result = self._result(stop_reason)   # before the CPU's last probe, which is no training
        self._record_system(final=True)
        return result

    def learning_rate(self, step: int) -> float:
        """The rate of step ``step`` (counted from 0), by mlbench's rule for the task."""
        return learning_rate(self.settings.lr, workers=self.world, batch_per_worker=self.settings.batch_per_worker,
                             step=step, steps_per_epoch=self.steps_per_epoch)

    def compile_step(self, rows: HoldsTrainingSet | None, minibatches: TakesMinibatches | None) -> float:
        """Compile the port's training step before the training clock starts, and return its
        seconds, recorded as this rank's ``setup/compile`` event. Left to the first step, XLA's
        compilation or tf.function's tracing was 62-79% of the training time of a 10-epoch run of
        task 2a. The warm-up step runs on zeros of the run's minibatch shape (task 2a's port:
        row 0 of its training set, ``batch_per_worker`` times, once for each length of the runs
        of steps the run will call: :meth:`run_lengths`), and the port drops its results: the
        run trains bit for bit as without it."""
        batch = self.settings.batch_per_worker
        begin = time.perf_counter()
        if rows is not None:
            for steps in self.run_lengths():
                rows.warm_up_rows(steps, batch)
        else:
            assert minibatches is not None
            x, y = self.data.test_batch(0, 1)   # a sample's shape and types, as train_batch's
            minibatches.warm_up(np.zeros((batch, *x.shape[1:]), x.numpy().dtype),
                                np.zeros(batch, y.numpy().dtype))
        seconds = time.perf_counter() - begin
        self.events.emit("setup/compile", seconds, epoch=0, step=0)
        return seconds

    def run_lengths(self) -> list[int]:
        """Every length of the runs of steps (:func:`step_runs`) this run's epochs are trained in,
        longest first: the programs a port that holds the training set compiles before training."""
        per_epoch = self.steps_per_epoch
        planned = per_epoch * self.settings.max_epochs
        whole, last = divmod(planned if self.cfg.max_steps is None else min(planned, self.cfg.max_steps), per_epoch)
        lengths = set(step_runs(0, per_epoch, self.cfg.log_every, None)) if whole else set()
        lengths.update(step_runs(0, last, self.cfg.log_every, None))   # the epoch max_steps ends in
        return sorted(lengths, reverse=True)

    def _record_system(self, final: bool = False) -> None:
        """This rank's ``system`` event, the PyTorch worker's: peak memory, the CPU's probed peak,
        the FLOPs of a step, as of now (with every logging interval and at the end, as the PyTorch
        worker writes it; at the end the CPU is probed again, off the training clock). No phase
        times: a port's step is one compiled program whose all-reduce cannot be timed apart, so
        its step time is the wall clock's."""
        import torch

        from mlbench.worker.sysmetrics import system_record

        train_time = self.train_time()
        if final:
            self.device_peak = self.device_peak.merged(self._probe_peak(self.cfg.threads_per_worker))
        self.events.emit("system", system_record(torch.device("cpu"), self.device_peak, self.step_flops,
                                                 steps=self.step, train_time=train_time),
                         epoch=self._epoch(), step=self.step)

    def _epoch(self) -> float:
        return self.step / self.steps_per_epoch

    def _log_interval(self, losses: list[Any], samples: int, lr: float) -> None:
        losses = [float(v) for run in losses for v in np.asarray(run, np.float64).ravel()]
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
        # what this process's sockets sent in the interval (the framework's collectives: no count
        # of ours sees inside them); the reference all-reduce's bytes where the system does not say
        measured = self.wire.take()
        sent = measured if measured is not None else len(losses) * self.bytes_per_step
        self.bytes_sent += sent
        emit("comm/bytes", sent, epoch=epoch, step=step)
        emit("comm/dense_bytes", len(losses) * self.bytes_per_step, epoch=epoch, step=step)
        for name, value in self.sys_sampler.sample().items():
            emit(name, value, epoch=epoch, step=step)
        self._record_system()

    def evaluate(self) -> bool:
        """Logits of this rank's share of the test set, scored by mlbench's NumPy scorer; the
        sums of all ranks; True at the goal."""
        from mlbench.tasks.data.sharding import eval_shard

        begin = time.perf_counter()
        self.wire.pause()   # the statistics' average and the sums' all-gather: no training traffic
        if self.heartbeat is not None:
            self.heartbeat.phase("evaluation")
        if self.world > 1:
            self.port.sync_statistics()
        start, stop = eval_shard(self.data.num_test, workers=self.world, rank=self.rank)
        totals = np.zeros(len(TOTALS), np.float64)
        for lo in range(start, stop, self.cfg.eval_batch_size):
            x, y = self.data.test_batch(lo, min(stop, lo + self.cfg.eval_batch_size))
            totals += score_outputs(self.settings.loss, self.port.logits(x.numpy()), y.numpy())
        summed = totals if self.world == 1 else self.sum_over_processes(totals)
        self.wire.resume()
        metrics = metrics_of(summed, self.port.regulariser())
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
            stop_reason=stop_reason, bytes_sent=self.bytes_sent,
            train_samples=self.data.num_train, test_samples=self.data.num_test)


def run_trainer(trainer: PortTrainer, environment: dict[str, Any], run_dir: Path | None = None) -> int:
    """Train (after the port's ``join``); record the environment (with ``environment``: the
    framework and its version, and the threads it computes with where it can tell them, else
    None) first and the result, with the machine's load at its end, last (rank 0); save the
    weights in ``run_dir`` with ``--save-model``; part; return 0."""
    from mlbench.results.environment import describe_environment, load_average, runnable_tasks

    if trainer.rank == 0:
        threads = {"threads_per_worker": None, "interop_threads": None}   # a framework's own, unless it says
        trainer.events.emit("environment", {**describe_environment(), **threads, **environment}, epoch=0, step=0)
    result = trainer.train()
    if run_dir is not None and trainer.cfg.save_model:
        trainer.save_model(run_dir)
    if trainer.heartbeat is not None:
        trainer.heartbeat.phase("finishing")
    if trainer.rank == 0:
        result.load_average_end = load_average()
        result.runnable_end = runnable_tasks()
        trainer.events.emit("result", result.to_dict(), epoch=result.epochs, step=result.steps)
    trainer.leave()
    return 0
