"""Writers of runs in the files of TensorBoard, MLflow and Weights & Biases (docs/exporters.md).

Each tool's own library writes its own format, so that the tool reads it as it reads anything
else it logged: TensorBoard event files through torch's ``SummaryWriter`` (one folder per run,
values as 64-bit floats, exactly as recorded), a local MLflow file store through
``MlflowClient`` (``mlflow ui --backend-store-uri DIR``), and a W&B offline run directory
through ``wandb.init(mode="offline")`` (``wandb sync DIR/wandb/offline-run-*`` uploads it).
The libraries are extras (``pip install 'mlbench-suite[tensorboard]'``); a missing one is one
line that names its extra.

A writer is opened with the run's head, takes points as they come (all at once after a run,
in batches during one) and is finished with the summary; on a failure half-way, what it
wrote is removed again, so a folder never holds half a run that looks whole.

No library is given a folder that mlbench has not written a file in first
(:func:`writable_folder`): W&B, given one it cannot write, writes the run into the system's
temporary folder instead, and the others fail in their own words. A W&B run that is not in
the folder asked for all the same is removed and refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mlbench.errors import UsageError
from mlbench.extras import MissingExtra, needs
from mlbench.results.export import ExportedRun, Point, RunHead, exportable, exported_run, last_step
from mlbench.results.store import CANCELLED, FAILED, FINISHED, RunRecord

TOOLS = ("tensorboard", "mlflow", "wandb")


@contextlib.contextmanager
def _library(tool: str, option: str = "--to") -> Iterator[None]:
    """Imports of ``tool``'s library; a missing one is one line naming the ``option`` and the
    extra (:class:`MissingExtra`, exit code 1)."""
    try:
        with needs(tool):
            yield
    except MissingExtra as err:
        raise MissingExtra(f"{option} {tool}: {err}") from None


def writable_folder(folder: Path, what: str, *, keep: bool = True) -> None:
    """Create ``folder`` (and its parents) and write and remove a file in it, or a usage error
    of one line, ``what`` first, naming the folder: a path under a file, a read-only file
    system, a folder without the permission. A real write, not ``os.access``, which root passes
    on a folder of mode 0555. The folders it created are removed again when it fails, and with
    ``keep=False`` (a check before a run exists) when it succeeds too."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    kept = False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".mlbench-write-test-", dir=folder)
        try:
            os.write(handle, b"mlbench")
        finally:
            os.close(handle)
            os.unlink(probe)
        kept = keep
    except FileExistsError:
        raise UsageError(f"{what}: {folder} is a file, not a folder") from None
    except OSError as err:
        doing = "write in" if folder.is_dir() else "create"
        raise UsageError(f"{what}: cannot {doing} the folder {folder} ({err.strerror or err})") from None
    finally:
        for made in () if kept else created:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()


class Writer(ABC):
    """One run in one tool's files."""

    tool: str = ""

    def __init__(self, out_dir: Path, head: RunHead):
        self.out_dir = out_dir
        self.head = head

    @classmethod
    @abstractmethod
    def conflict(cls, out_dir: Path, head: RunHead) -> str | None:
        """Why ``out_dir``, a folder mlbench has written in (:func:`writable_folder`), cannot take
        this run (it holds it already, or is something else)."""

    @abstractmethod
    def write(self, points: Sequence[Point]) -> None:
        """Add points (in time order)."""

    @abstractmethod
    def finish(self, summary: dict[str, float], step: int, state: str, when: float) -> None:
        """Write the summary at ``step`` and close the run as ``state`` (mlbench's)."""

    @abstractmethod
    def discard(self) -> None:
        """Remove what this writer wrote (it failed half-way)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the run is now, for the user."""


def metrics_text(head: RunHead) -> str:
    """The run and its goal metric, as a markdown note beside the curves."""
    info = head.metric_info
    direction = "higher is better" if info["higher_is_better"] else "lower is better"
    return (f"mlbench run `{head.id}` ({head.name}), {head.task}, {head.state}. Goal metric: "
            f"`{info['goal_metric']}`, {info['goal_metric_title']} ({info['goal_metric_unit'] or 'a number'}, "
            f"{direction}). Rank 0's series are under the events' names, worker r's under `rank<r>/`.")


def tensorboard_without_tensorflow() -> None:
    """Have tensorboard reach the file system through its own TensorFlow-free stub.

    tensorboard's file access (``tensorboard.compat.tf``, which torch's SummaryWriter and the
    event writer use for ``gfile``) imports all of TensorFlow when it is installed, unless the
    module ``tensorboard.compat.notf`` exists: tensorboard's own switch to its stub (its
    ``//tensorboard/compat:no_tensorflow`` build). With TensorFlow 2.21 installed (the
    ``tensorflow`` extra) that import cost an export, and rank 0 of a run logged live to
    TensorBoard, 4.6 CPU-seconds, and its LLVM made a later load of torch's flop counter in the
    process crash it (SIGSEGV). The event files mlbench writes go to a local folder, which the
    stub's ``gfile`` writes as TensorFlow's would. A process that imported TensorFlow already (a
    TensorFlow worker logging live) is left alone: there TensorFlow costs nothing more, and
    tensorboard's TensorFlow 2 summaries (``tensorboard.compat.tf2``), which the stub does not
    have, keep working in it.
    """
    import sys
    import types

    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class TensorBoardWriter(Writer):
    """``DIR/<run id>/events.out.tfevents.*``: scalars (double precision), the configuration as
    hparams, a note naming the goal metric."""

    tool = "tensorboard"

    def __init__(self, out_dir: Path, head: RunHead):
        super().__init__(out_dir, head)
        tensorboard_without_tensorflow()
        with _library("tensorboard"):
            from tensorboard.plugins.hparams import summary_v2
            from torch.utils.tensorboard import SummaryWriter
        self.folder = out_dir / head.id
        self.writer = SummaryWriter(log_dir=str(self.folder))
        file_writer: Any = self.writer.file_writer  # created by the SummaryWriter's __init__
        file_writer.add_summary(
            summary_v2.hparams_pb(dict(head.hparams), trial_id=head.id, start_time_secs=head.started_at),
            0, head.started_at)

    @classmethod
    def conflict(cls, out_dir: Path, head: RunHead) -> str | None:
        folder = out_dir / head.id
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            return f"{folder} exists already (an export of run {head.id}?): remove it or choose another folder"
        return None

    def write(self, points: Sequence[Point]) -> None:
        for p in points:
            self.writer.add_scalar(p.tag, p.value, p.step, walltime=p.time, new_style=True,
                                   double_precision=True)
        self.writer.flush()

    def finish(self, summary: dict[str, float], step: int, state: str, when: float) -> None:
        self.head = dataclasses.replace(self.head, state=state)  # (a live export began it running)
        self.writer.add_text("mlbench/run", metrics_text(self.head), 0, walltime=self.head.started_at)
        self.write([Point(tag, value, step, when) for tag, value in summary.items()])
        self.writer.close()

    def discard(self) -> None:
        self.writer.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def location(self) -> str:
        return str(self.folder)


_MLFLOW_STATUS = {FINISHED: "FINISHED", FAILED: "FAILED", CANCELLED: "KILLED"}


class MlflowWriter(Writer):
    """A run in the local MLflow file store at ``DIR``, in the experiment ``mlbench-<task>``:
    metrics with their steps and times, the configuration as parameters, tags naming the run
    and its goal metric. The file store is in maintenance mode in MLflow 3, which refuses it
    unless ``MLFLOW_ALLOW_FILE_STORE`` is set: it is set here (and the UI needs it too)."""

    tool = "mlflow"
    BATCH = 1000  # MLflow's limit of metrics per log_batch
    PARAMS = 100  # and of parameters

    def __init__(self, out_dir: Path, head: RunHead):
        super().__init__(out_dir, head)
        self.client = self._client(out_dir)
        from mlflow.entities import Param, RunTag
        experiment = f"mlbench-{head.task}"
        with _quiet():
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            tags = {"mlbench.run_id": head.id, "mlbench.task": head.task, "mlbench.state": head.state,
                    **{f"mlbench.{k}": str(v) for k, v in head.metric_info.items()},
                    **({"mlbench.group_id": head.group_id} if head.group_id else {})}
            self.run_id = self.client.create_run(experiment_id, start_time=int(head.started_at * 1000),
                                                 run_name=head.name, tags=tags).info.run_id
            self.client.log_batch(self.run_id, tags=[RunTag("mlflow.note.content", metrics_text(head))])
            params = [Param(k, str(v)) for k, v in head.hparams.items()]
            for i in range(0, len(params), self.PARAMS):
                self.client.log_batch(self.run_id, params=params[i:i + self.PARAMS])

    @staticmethod
    def _client(out_dir: Path) -> Any:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        with _library("mlflow"):
            from mlflow.tracking import MlflowClient
        with _quiet():
            return MlflowClient(tracking_uri=out_dir.resolve().as_uri())

    @classmethod
    def conflict(cls, out_dir: Path, head: RunHead) -> str | None:
        if any(out_dir.iterdir()) and not any((out_dir / name).exists() for name in (".trash", "0/meta.yaml")):
            return f"{out_dir} is a folder with other files, not an MLflow file store: choose another folder"
        client = cls._client(out_dir)
        with _quiet():
            ids = [e.experiment_id for e in client.search_experiments()]
            runs = client.search_runs(ids, filter_string=f"tags.`mlbench.run_id` = '{head.id}'") if ids else []
        if runs:
            return (f"the MLflow store {out_dir} holds run {head.id} already (MLflow run "
                    f"{runs[0].info.run_id}): delete it there or choose another folder")
        return None

    def write(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric
        metrics = [Metric(p.tag, float(p.value), int(p.time * 1000), p.step) for p in points]
        with _quiet():
            for i in range(0, len(metrics), self.BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i:i + self.BATCH])

    def finish(self, summary: dict[str, float], step: int, state: str, when: float) -> None:
        from mlflow.entities import RunTag
        self.head = dataclasses.replace(self.head, state=state)  # (a live export began it running)
        self.write([Point(tag, value, step, when) for tag, value in summary.items()])
        with _quiet():
            self.client.log_batch(self.run_id, tags=[RunTag("mlbench.state", state),
                                                     RunTag("mlflow.note.content", metrics_text(self.head))])
            self.client.set_terminated(self.run_id, _MLFLOW_STATUS.get(state, "FAILED"), int(when * 1000))

    def discard(self) -> None:
        with _quiet():
            self.client.delete_run(self.run_id)

    @property
    def location(self) -> str:
        return f"{self.out_dir.resolve().as_uri()} (MLflow run {self.run_id})"


class WandbWriter(Writer):
    """A W&B offline run under ``DIR/wandb/offline-run-*-<run id>`` (W&B's run id is mlbench's):
    each step's points as one history row with the step in ``step`` (task 0a's sweep rows with
    the message size in ``allreduce/bytes``), the configuration as config, the summary as
    summary. ``wandb sync`` uploads it later."""

    tool = "wandb"

    def __init__(self, out_dir: Path, head: RunHead):
        super().__init__(out_dir, head)
        with _library("wandb"):
            import wandb
        # ``dir`` (W&B's root_dir) is given, which wins over a WANDB_DIR of the environment; W&B
        # still writes into tempfile.gettempdir() when it finds it unusable (its
        # ``try_create_root_dir``: os.makedirs fails or os.access denies it), hence the check below.
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False)
        self.run = wandb.init(dir=str(out_dir.resolve()), project="mlbench", name=head.name, id=head.id,
                              group=head.group_id, job_type=head.task, tags=[head.task],
                              notes=metrics_text(head), config={**head.hparams, **{
                                  f"mlbench.{k}": v for k, v in head.metric_info.items()}},
                              mode="offline", settings=settings, reinit="create_new")
        if not self._in_out_dir(self.folder):
            elsewhere = self.folder
            self.discard()
            raise UsageError(f"W&B did not write into {out_dir} but into {elsewhere} (removed again): "
                             "choose a folder it can write")
        self.run.define_metric("step")
        self.run.define_metric("allreduce/bytes")
        self.run.define_metric("*", step_metric="step")
        self._defined: set[str] = set()

    @classmethod
    def conflict(cls, out_dir: Path, head: RunHead) -> str | None:
        found = sorted((out_dir / "wandb").glob(f"*-{head.id}"))
        if found:
            return f"{found[0]} exists already (an export of run {head.id}): remove it or choose another folder"
        return None

    def write(self, points: Sequence[Point]) -> None:
        row: dict[str, Any] = {}
        for p in points:
            sweep = p.tag.startswith("allreduce/")
            axis = "allreduce/bytes" if sweep else "step"
            if sweep and p.tag not in self._defined:
                self.run.define_metric(p.tag, step_metric="allreduce/bytes")
                self._defined.add(p.tag)
            if row and (p.tag in row or row.get(axis) != p.step or (axis not in row)):
                self.run.log(row)
                row = {}
            row[axis] = p.step
            row[p.tag] = p.value
        if row:
            self.run.log(row)

    def finish(self, summary: dict[str, float], step: int, state: str, when: float) -> None:
        self.head = dataclasses.replace(self.head, state=state)  # (a live export began it running)
        self.run.notes = metrics_text(self.head)
        self.run.summary.update(summary)
        self.run.finish(exit_code=0 if state == FINISHED else 1)
        written = self.folder / f"run-{self.head.id}.wandb"
        if not (written.is_file() and self._in_out_dir(written)):
            raise UsageError(f"W&B did not write {written} in {self.out_dir}")

    @property
    def folder(self) -> Path:
        """The run's folder, where W&B put it (``run.dir`` is its ``files/`` folder)."""
        return Path(self.run.dir).parent

    def _in_out_dir(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self.out_dir.resolve())

    def discard(self) -> None:
        """The run's folder, and W&B's links to it beside it (``latest-run``, ``debug.log``,
        ``debug-internal.log``), and W&B's folder when that is then empty."""
        folder = self.folder.resolve()
        self.run.finish(exit_code=1)
        shutil.rmtree(folder, ignore_errors=True)
        for link in folder.parent.iterdir() if folder.parent.is_dir() else ():
            if link.is_symlink() and (folder.parent / os.readlink(link)).resolve().is_relative_to(folder):
                link.unlink()
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # (only when empty)

    @property
    def location(self) -> str:
        return str(self.folder)


WRITERS: dict[str, type[Writer]] = {w.tool: w for w in (TensorBoardWriter, MlflowWriter, WandbWriter)}


def check_library(tool: str, option: str = "--to") -> None:
    """Before any run is read or started: a usage error unless ``tool`` is one of
    :data:`TOOLS`, :class:`MissingExtra` (naming ``option``) unless its library is installed."""
    if tool not in WRITERS:
        raise UsageError(f"unknown export target {tool!r}: choose from {', '.join(TOOLS)}")
    with _library(tool, option):
        __import__(tool)  # each tool's module is called as the tool


def shut_down(tool: str) -> None:
    """End what a tool's library keeps running after its runs (W&B's service process)."""
    if tool == "wandb":
        import wandb
        wandb.teardown()


def write_run(tool: str, out_dir: Path, run: ExportedRun, finished_at: float) -> str:
    """One exported run in ``tool``'s files; its location. Removed again on a failure."""
    writer = WRITERS[tool](out_dir, run.head)
    try:
        writer.write(run.points)
        writer.finish(run.summary, last_step(run.points), run.head.state, finished_at)
    except BaseException:
        writer.discard()
        raise
    return writer.location


def export_runs(records: Sequence[RunRecord], tool: str, out_dir: str | os.PathLike) -> list[str]:
    """Export ended runs to ``tool``'s files under ``out_dir``; where each went. Every run is
    checked first (ended, not exported there already), so that nothing is written for a
    request that cannot be done whole."""
    check_library(tool)
    folder = Path(out_dir)
    runs = [exported_run(exportable(r)) for r in records]
    writable_folder(folder, f"--to {tool}")
    for run in runs:
        problem = WRITERS[tool].conflict(folder, run.head)
        if problem:
            raise UsageError(problem)
    try:
        return [write_run(tool, folder, run, record.finished_at or time.time())
                for run, record in zip(runs, records)]
    finally:
        shut_down(tool)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MLflow warns about its file store on every use; the user chose it knowingly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
