"""``python -m mlbench.worker.tf_worker RUN_DIR [--rank R]``: one TensorFlow 2 worker of a run.

The TensorFlow implementation of the worker contract (docs/worker-contract.md): the rank, world
size and rendezvous come from ``--rank`` and run.json (or another launcher's environment, as for
the PyTorch worker); the processes meet through ``tf.distribute.MultiWorkerMirroredStrategy``.
Its cluster is TensorFlow's ``TF_CONFIG``: every worker runs a gRPC server of its own, so each
needs an address, which the local supervisor picks on 127.0.0.1 and passes to every worker as
``MLBENCH_PEERS`` (``host:port`` per rank, comma-separated); the tasks of a Slurm step derive
them from the step's variables (:func:`mlbench.worker.launcher_env.slurm_peers`); a ``TF_CONFIG`` already in the
environment (another launcher's) is used as it is. The data, their order, the training loop and
the evaluation are those of every port (:mod:`mlbench.worker.port_trainer`); the model and its
update are :mod:`mlbench.tasks.task2a.tf_model`'s (task 2a) or :mod:`mlbench.tasks.task1a.tf_model`'s
(task 1a). The local supervisor forks it from itself (torch and TensorFlow imported: :func:`preload`);
other launchers start it as a fresh interpreter. Exit codes are the PyTorch worker's: 0 done, 1 failed,
143 stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.errors import MlbenchError
from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.worker.heartbeat import Heartbeat
from mlbench.worker.launcher_env import PEERS_ENV, slurm_peers
from mlbench.worker.port_trainer import PortTrainer, import_ports, run_trainer, worker_main


def main(argv: list[str] | None = None) -> int:
    return worker_main("mlbench.worker.tf_worker", join, run_worker, argv)


def cluster_config(rank: int, workers: int, peers: str | None) -> dict[str, Any]:
    """The ``TF_CONFIG`` of rank ``rank``: a cluster of ``workers`` workers at ``peers``."""
    addresses = [a.strip() for a in (peers or "").split(",") if a.strip()]
    if len(addresses) != workers:
        raise MlbenchError(f"{PEERS_ENV} names {len(addresses)} worker address(es), the run has {workers} "
                           f"workers: start TensorFlow workers with `mlbench run ... --framework tensorflow`, "
                           "or set TF_CONFIG")
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}


#: What TensorFlow's native code prints while it is imported, before absl's logging is set up,
#: which TF_CPP_MIN_LOG_LEVEL does not silence then (abseil/abseil-cpp#1718): absl's notice
#: and oneDNN's (an INFO line). Not for a user's terminal; anything else still gets there.
IMPORT_NOISE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                          r"|I\d{4} [^\]]*\] oneDNN custom operations are on\..*")


@contextlib.contextmanager
def native_stderr_filtered(noise: re.Pattern[str] = IMPORT_NOISE) -> Iterator[None]:
    """The process's standard error (file descriptor 2, where native code writes) into a
    temporary file while the block runs; then every line of it that is not ``noise`` back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not noise.fullmatch(line.rstrip("\n")))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def preload() -> None:
    """Import TensorFlow and the port's models (:func:`mlbench.launch.forked.preload_port`: the
    local supervisor, before it forks the ranks). Importing makes no TensorFlow object: the
    strategy, which must come first, is each rank's (:func:`join`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from mlbench.tasks.flops import load_flop_counter

    load_flop_counter()   # before TensorFlow (see join)
    with native_stderr_filtered():
        import_ports("tensorflow")


def join(config: RunConfig, rank: int, coordinator: str) -> Any:
    """The run's MultiWorkerMirroredStrategy (None for a single process), made before any other
    TensorFlow operation, as the strategy requires; TensorFlow on CPUs only, its own log quiet.
    (``coordinator``, rank 0's address, is not TensorFlow's way: each worker has its own.)"""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""   # the port runs on CPUs (a GPU build would take a GPU)
    if config.workers > 1 and "TF_CONFIG" not in os.environ:
        peers = os.environ.get(PEERS_ENV)
        if peers is None and "SLURM_PROCID" in os.environ and "SLURM_JOB_ID" in os.environ:
            peers = slurm_peers(os.environ)   # a task of a Slurm step: its addresses follow from the step
        os.environ["TF_CONFIG"] = json.dumps(cluster_config(rank, config.workers, peers))
    from mlbench.tasks.flops import load_flop_counter

    load_flop_counter()   # before TensorFlow, or counting the step's FLOPs crashes the process
    with native_stderr_filtered():
        import tensorflow as tf

    threads = int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    if config.workers == 1:
        return None
    ring = tf.distribute.experimental.CommunicationImplementation.RING
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring))


def run_worker(config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None,
               strategy: Any = None, run_dir: Path | None = None) -> int:
    """Train as rank ``rank`` (after :func:`join`, with the strategy it made); record the result
    (rank 0); return 0. Also what the tests call in-process for one worker."""
    import tensorflow as tf

    # the threads TensorFlow computes with: OMP_NUM_THREADS's (join), None where it was not set
    # and TensorFlow chose for itself (its 0)
    threads = {"threads_per_worker": tf.config.threading.get_intra_op_parallelism_threads() or None,
               "interop_threads": tf.config.threading.get_inter_op_parallelism_threads() or None}
    return run_trainer(TfTrainer(config, rank, events, heartbeat, strategy),
                       {"framework": "tensorflow", "tensorflow": tf.__version__, **threads}, run_dir)


class TfTrainer(PortTrainer):
    """The ports' training loop around the TensorFlow model of the run's task (its package's
    ``tf_model``: task 2a's logistic regression, task 1a's ResNet), in ``strategy``."""

    framework = "tensorflow"

    def __init__(self, config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None,
                 strategy: Any = None):
        self.strategy = strategy
        super().__init__(config, rank, events, heartbeat)

    def port_context(self) -> dict[str, Any]:
        return {"strategy": self.strategy}

    def sum_over_processes(self, totals: np.ndarray) -> np.ndarray:
        """Every process's float64 ``totals`` gathered (the replica context's all-gather), then
        summed in NumPy in rank order."""
        gathered = self._all_gather(np.asarray(totals, np.float64)[None])
        return np.asarray(gathered, np.float64).sum(axis=0)

    def _all_gather(self, value: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        strategy = self.strategy
        device = strategy.extended.worker_devices[0]

        def gather(v: tf.Tensor) -> tf.Tensor:
            with tf.device(device):
                v = tf.identity(v)
            return tf.distribute.get_replica_context().all_gather(v, axis=0)

        result = strategy.run(tf.function(gather), args=(tf.constant(value),))
        return strategy.experimental_local_results(result)[0].numpy()

    def leave(self) -> None:
        """The last collective: no process leaves while another still needs it."""
        if self.world > 1:
            self._all_gather(np.zeros((1, 1), np.float32))


if __name__ == "__main__":
    sys.exit(main())
