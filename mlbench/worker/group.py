"""Joining and leaving the torch.distributed process group.

Rendezvous goes through a TCPStore hosted by rank 0. Locally, the launcher binds the store's
socket to 127.0.0.1 on a port the OS picks and hands the listening socket to rank 0
(``master_listen_fd``): the store is never reachable from outside this machine (a TCPStore left
to itself listens on every interface), and two runs can never collide on a port.

In a pod, the environment says where rank 0 is (``MLBENCH_MASTER_ADDR``/``MLBENCH_MASTER_PORT``:
its DNS name through the run's headless Service) and where its store listens
(``MLBENCH_BIND_ADDR``: the pod's IP, so the store is on the pod network and nowhere else).
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from mlbench.run_config import RunConfig

RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("MLBENCH_RENDEZVOUS_TIMEOUT", 300)))


def _listen(host: str, port: int, backlog: int) -> int:
    """A listening socket on host:port whose descriptor the TCPStore takes over."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog).detach()


def init_group(config: RunConfig, rank: int, store_fd: int | None = None) -> None:
    is_master = rank == 0
    addr = os.environ.get("MLBENCH_MASTER_ADDR") or config.master_addr
    port = int(os.environ.get("MLBENCH_MASTER_PORT") or config.master_port)
    if is_master and store_fd is None and os.environ.get("MLBENCH_BIND_ADDR"):
        store_fd = _listen(os.environ["MLBENCH_BIND_ADDR"], port, config.workers * 2)
    store = dist.TCPStore(addr, port, config.workers, is_master,
                          RENDEZVOUS_TIMEOUT, wait_for_workers=False,
                          master_listen_fd=store_fd if is_master else None)
    device_id = None
    if config.backend == "nccl":  # bind the communicator to this rank's GPU up front
        device_id = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device_id)
    dist.init_process_group(config.backend, store=store, rank=rank, world_size=config.workers,
                            timeout=RENDEZVOUS_TIMEOUT, device_id=device_id)


def leave_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
