"""Joining and leaving the torch.distributed process group.

Rendezvous goes through a TCPStore hosted by rank 0. Locally, the launcher binds the store's
socket to 127.0.0.1 on a port the OS picks and hands the listening socket to rank 0
(``master_listen_fd``): the store is never reachable from outside this machine (a TCPStore left
to itself listens on every interface), and two runs can never collide on a port.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from mlbench.worker.config import RunConfig

RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("MLBENCH_RENDEZVOUS_TIMEOUT", 300)))


def init_group(config: RunConfig, rank: int, store_fd: int | None = None) -> None:
    is_master = rank == 0
    store = dist.TCPStore(config.master_addr, config.master_port, config.workers, is_master,
                          RENDEZVOUS_TIMEOUT, wait_for_workers=False,
                          master_listen_fd=store_fd if is_master else None)
    dist.init_process_group(config.backend, store=store, rank=rank, world_size=config.workers,
                            timeout=RENDEZVOUS_TIMEOUT)


def leave_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
