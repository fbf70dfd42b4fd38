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
same order (:mod:`mlbench.worker.port_trainer`, the loop every port shares). The local
supervisor forks it (its ``main``) from itself once torch and JAX are imported (:func:`preload`), as it forks
the PyTorch worker; other launchers start it as a fresh interpreter. Exit codes are the PyTorch
worker's: 0 done, 1 failed, 143 stopped.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

import numpy as np

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.worker.heartbeat import Heartbeat
from mlbench.worker.port_trainer import PortTrainer, import_ports, run_trainer, worker_main


def main(argv: list[str] | None = None) -> int:
    return worker_main("mlbench.worker.jax_worker", _join, run_worker, argv)


def preload() -> None:
    """Import JAX, Optax and the port's models (:func:`mlbench.launch.forked.preload_port`: the
    local supervisor, before it forks the ranks). Importing starts no backend: each rank
    configures and starts its own (:func:`_join`)."""
    import_ports("jax")


def _join(config: RunConfig, rank: int, coordinator: str) -> None:
    """One CPU device per process; the processes of a run of several meet at the coordinator
    (rank 0 hosts it, listening where :func:`coordinator_bind_address` says) and all-reduce
    over gloo."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if config.workers > 1:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=config.workers,
                                   process_id=rank, local_device_ids=[0],
                                   initialization_timeout=300,
                                   coordinator_bind_address=coordinator_bind_address(coordinator))


def coordinator_bind_address(coordinator: str) -> str | None:
    """Where rank 0's coordinator listens, as PyTorch's store does (mlbench.worker.group): on
    the address ``MLBENCH_BIND_ADDR`` names (a pod's IP, an emulated network's namespace), on the
    loopback address a local run meets at; else (a host name under Slurm or torchrun) None,
    JAX's default of every interface. Left to itself, JAX listens on every interface
    (``[::]:PORT``), so a local run's coordinator was reachable from other machines."""
    host, _, port = coordinator.rpartition(":")
    bind = os.environ.get("MLBENCH_BIND_ADDR")
    if bind:
        return f"[{bind}]:{port}" if ":" in bind else f"{bind}:{port}"
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return None
    return coordinator if loopback else None


def run_worker(config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None,
               group: None = None, run_dir: Path | None = None) -> int:
    """Train as rank ``rank`` (after :func:`_join`); record the result (rank 0); return 0.

    Also what the tests call in-process for one worker."""
    import jax

    return run_trainer(JaxTrainer(config, rank, events, heartbeat), {"framework": "jax", "jax": jax.__version__},
                       run_dir)


class JaxTrainer(PortTrainer):
    """The ports' training loop around the JAX model of the run's task (its package's
    ``jax_model``: task 2a's logistic regression, task 1a's ResNet)."""

    framework = "jax"

    def sum_over_processes(self, totals: np.ndarray) -> np.ndarray:
        """JAX computes in float32 here (x64 is off), so each value travels as a float32 pair
        (value, remainder) that restores it to about 48 bits, and the sum is taken in NumPy in
        rank order."""
        from jax.experimental import multihost_utils

        high = totals.astype(np.float32)
        low = (totals - high.astype(np.float64)).astype(np.float32)
        gathered = np.asarray(multihost_utils.process_allgather(np.stack([high, low])), np.float64)
        return (gathered[:, 0] + gathered[:, 1]).sum(axis=0)

    def leave(self) -> None:
        if self.world > 1:
            import jax

            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("mlbench: done")
            jax.distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
