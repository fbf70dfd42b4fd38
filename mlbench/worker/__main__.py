"""``python -m mlbench.worker RUN_DIR [--rank R]``: one worker process of a run.

Reads ``RUN_DIR/run.json``, joins the torch.distributed group, trains, and records metric events.
Without ``--rank`` the rank, world size and rendezvous come from the launcher that started it
(torchrun, srun, mpirun: :mod:`mlbench.worker.launcher_env`); the number of workers it started
must be the run's.
Exit codes: 0 done; 1 failed (the reason is the last ``error`` event and the log); 2 a usage
error before anything was recorded (RUN_DIR holds no run, or its run has finished already); 4 a
failure no restart can mend (:data:`mlbench.worker.failures.PERMANENT_EXIT`: bad data, a full
disk); 143 stopped by SIGTERM. A user mistake (missing data, ...) is recorded as one line, never
as a traceback only.

A run with checkpoints (``--checkpoint-every``) stops cleanly on SIGTERM (Ctrl-C, cancel): the
signal only asks; the workers agree on it at their next clock check (a fraction of a second),
write their checkpoint together and exit with 143. A worker that cannot get there (blocked in a
collective whose peer is gone) is ended by the SIGTERM watchdog as before, its newest complete
checkpoint intact.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mlbench.optim.base import whole_tensor
from mlbench.errors import MlbenchError
from mlbench.results.events import EventWriter, FileSink, events_path, read_rank_events
from mlbench.worker.failures import PERMANENT_EXIT, permanent_cause, record_error, say, stalled_peer, worker_failed
from mlbench.results.http_sink import beat_sender, open_sink
from mlbench.run_config import RunConfig, RunDocument
from mlbench.worker.group import init_group, leave_group
from mlbench.worker.heartbeat import SUPERVISED_ENV, Heartbeat
from mlbench.worker.launcher_env import MLBENCH, LaunchEnv, check_world_size, launcher_env

# how long the SIGTERM handler has to end the worker before the watchdog does (below the local
# launcher's 4 s and a pod's 15 s before SIGKILL)
SIGTERM_GRACE_SECONDS = 2.0
# the same with checkpoints: time for the workers to agree on the stop and write their state
CHECKPOINT_GRACE_SECONDS = 3.5


class StopRequest:
    """SIGTERM as a request to stop at the next step, for a run that writes checkpoints (the
    trainer asks :meth:`__call__`); without checkpoints it ends the worker at once (143)."""

    def __init__(self, polite: bool):
        self.polite = polite
        self.requested = False

    def handle(self, signum: int, frame: object) -> None:
        if not self.polite:
            sys.exit(143)
        self.requested = True

    def __call__(self) -> bool:
        return self.requested


def finished_already(run_dir: Path, document: RunDocument) -> bool:
    """Whether rank 0 recorded the run's result since its latest resume (`mlbench resume`, which
    a finished run of this machine, Slurm or Kubernetes may get, to a larger step cap): its workers
    started again, by a user's torchrun or srun on a ``--record-only`` run, would append a second
    copy of every event to its files. A ``--record-only`` run is never resumed: a new one is."""
    resumed = max((float(r["at"]) for r in document.resumes if isinstance(r.get("at"), (int, float))), default=None)
    return any(e["name"] == "result" and (resumed is None or float(e.get("time") or 0.0) > resumed)
               for e in read_rank_events(events_path(run_dir, 0)))


def main(argv: list[str] | None = None) -> int:
    """The worker's entry point: :func:`_main`, whose failures before training (a full disk at
    its first heartbeat) end with the class of exit code :func:`run_worker`'s do."""
    try:
        return _main(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        say(f"Error: {type(err).__name__}: {err}".splitlines()[0][:500])
        return PERMANENT_EXIT if permanent_cause(err) is not None else 1


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlbench.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rank", type=int, default=None,
                        help="this worker's rank [from torchrun's, srun's or mpirun's environment]")
    parser.add_argument("--iface", default=None,
                        help="network interface for the backends' traffic between machines")
    parser.add_argument("--store-fd", type=int, default=None,
                        help="listening socket for the rendezvous store (rank 0, local runs)")
    args = parser.parse_args(argv)

    stop = StopRequest(polite=False)
    signal.signal(signal.SIGTERM, stop.handle)
    try:   # RUN_DIR is typed by a user into a torchrun, srun or mpirun command (--record-only)
        document = RunDocument.load(args.run_dir)
    except (OSError, ValueError) as err:
        what = "holds no run.json" if isinstance(err, FileNotFoundError) else f"has no readable run.json ({err})"
        print(f"Error: {args.run_dir} {what}: give the run folder that `mlbench run --record-only` "
              "printed in its commands", file=sys.stderr)
        return 2
    if finished_already(args.run_dir, document):
        config = document.config
        print(f"Error: the run in {args.run_dir} has finished already (its result is recorded); starting its "
              "workers again would add a second copy of every event. To train again, record a new run: "
              f"mlbench run {config.task.name} {config.workers} ... --record-only", file=sys.stderr)
        return 2
    config = document.config
    stop.polite = config.checkpoints
    try:
        launch = launcher_env(args.rank)
    except MlbenchError as err:
        # no rank to speak for: recorded as rank 0's, the one a lone process would be
        _record_refusal(args.run_dir, 0, document.id, str(err))
        print(f"Error: {err}", file=sys.stderr)
        return err.exit_code
    try:
        check_world_size(launch, config.workers, args.run_dir)
    except MlbenchError as err:
        _record_refusal(args.run_dir, max(launch.rank, 0), document.id, str(err))
        print(f"Error: {err}", file=sys.stderr)
        return err.exit_code
    # a file per rank on the run folder's (shared) file system; HTTP to the results service
    # when the environment names one (a pod)
    sink = open_sink(args.run_dir, launch.rank, document.id)
    events = EventWriter(sink, launch.rank)
    _end_even_when_blocked(events, CHECKPOINT_GRACE_SECONDS if config.checkpoints else SIGTERM_GRACE_SECONDS)
    # no mlbench supervisor owns workers started by torchrun, srun or mpirun: they watch each other
    # (a heartbeat posted to the results service is judged there: by the pod supervisor for a
    # pod, else by the service's own watchdog, whose verdict comes back in the answer)
    watch_peers = isinstance(sink, FileSink) and launch.source != MLBENCH and not os.environ.get(SUPERVISED_ENV)
    heartbeat = Heartbeat(args.run_dir, launch.rank, config.workers, watchdog_s=config.watchdog_s,
                          watch_peers=watch_peers, on_stall=functools.partial(stalled_peer, events),
                          send=beat_sender(args.run_dir, document.id)).start()
    return run_worker(config, launch.rank, events, store_fd=args.store_fd, run_dir=args.run_dir,
                      launch=launch, iface=args.iface, heartbeat=heartbeat, stop_requested=stop)


def run_worker(config: RunConfig, rank: int, events: EventWriter, store_fd: int | None = None,
               run_dir: Path | None = None, launch: LaunchEnv | None = None,
               iface: str | None = None, heartbeat: Heartbeat | None = None,
               stop_requested: Callable[[], bool] | None = None) -> int:
    """Train as rank ``rank``; record the result (rank 0) or the error; return the exit code.

    With ``save_model`` the final parameters go to ``RUN_DIR/checkpoints/rank-<r>.pt``.
    ``heartbeat`` is told the training's progress (the watchdog's evidence);
    ``stop_requested`` says when to stop cleanly (a run with checkpoints: 143 after writing one).
    """
    import torch

    from mlbench.results.environment import describe_environment, load_average, runnable_tasks
    from mlbench.worker.trainer import Stopped, Trainer

    torch.set_num_threads(max(1, config.threads_per_worker))
    try:
        init_group(config, rank, store_fd, launch, iface)
        if rank == 0:
            # the threads this worker really computes with (the run's, as torch took them)
            threads = {"threads_per_worker": torch.get_num_threads(),
                       "interop_threads": torch.get_num_interop_threads()}
            events.emit("environment", {**describe_environment(), **threads}, epoch=0, step=0)
        if config.task.kind == "allreduce":  # task 0a: a communication benchmark, no training
            from mlbench.tasks.registry import runtime_module
            result = runtime_module(config.task).run_benchmark(config, rank, events)
        else:
            trainer = Trainer(config, rank, events, heartbeat, run_dir, stop_requested)
            trainer.setup()
            try:
                result = trainer.train().to_dict()
            except Stopped as stopped:
                print(str(stopped), file=sys.stderr)
                return 143
            if config.save_model and run_dir is not None:
                (run_dir / "checkpoints").mkdir(exist_ok=True)
                whole = {name: whole_tensor(t) for name, t in trainer.model.state_dict().items()}  # fsdp's too
                torch.save(whole, run_dir / "checkpoints" / f"rank-{rank}.pt")
        if heartbeat is not None:
            heartbeat.phase("finishing")
        if rank == 0:
            result["load_average_end"] = load_average()   # the machine's load as the run ends
            result["runnable_end"] = runnable_tasks()
            events.emit("result", result, epoch=result["epochs"], step=result["steps"])
        leave_group()
        return 0
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        return worker_failed(events, err)
    finally:
        if heartbeat is not None:
            heartbeat.stop()  # its silence from now on blames nobody
        try:
            events.close()
        except OSError:
            pass


def _end_even_when_blocked(events: EventWriter, grace_s: float = SIGTERM_GRACE_SECONDS) -> None:
    """SIGTERM ends the worker with 143 even while its main thread waits in a collective whose
    peer is gone: Python runs the SIGTERM handler only between bytecodes, and gloo's wait, in
    C++, returns only at the group's timeout (minutes), so a stopped run's workers would wait
    for SIGKILL (a pod's whole grace period). The C-level handler still writes the signal's
    number to the wakeup fd; a watchdog thread reads it, gives the handler ``grace_s`` to end
    the process the usual way, then delivers the recorded events itself and exits. (Before the
    event sink exists nothing blocks in C++, and the handler alone ends the worker.)"""
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable, warn_on_full_buffer=False)

    def wait_for_sigterm() -> None:
        while signal.SIGTERM not in os.read(readable, 64):
            pass
        time.sleep(grace_s)
        try:
            events.close()   # the HTTP sink delivers what is buffered, within its limit
        except Exception:  # exiting regardless; the log has the rest
            pass
        os._exit(143)

    threading.Thread(target=wait_for_sigterm, name="sigterm-watch", daemon=True).start()


def _record_refusal(run_dir: Path, rank: int, run_id: str | None, message: str) -> None:
    """Record why a worker refused to start as its ``error`` event, so that the run is marked
    failed with that reason: under torchrun, srun or mpirun no mlbench process watches the run,
    which would otherwise stay pending for ever. Best effort, as :func:`mlbench.worker.failures.record_error`."""
    try:
        events = EventWriter(open_sink(run_dir, rank, run_id), rank)
        record_error(events, message)
        events.close()
    except (MlbenchError, OSError) as err:
        print(f"could not record the error event: {err}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
