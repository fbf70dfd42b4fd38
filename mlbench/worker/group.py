"""Joining and leaving the torch.distributed process group.

Rendezvous goes through a TCPStore hosted by rank 0. Locally, the launcher binds the store's
socket to 127.0.0.1 on a port the OS picks and hands the listening socket to rank 0
(``master_listen_fd``): the store is never reachable from outside this machine (a TCPStore left
to itself listens on every interface), and two runs can never collide on a port.

In a pod, the environment says where rank 0 is (``MLBENCH_MASTER_ADDR``/``MLBENCH_MASTER_PORT``:
its DNS name through the run's headless Service) and where its store listens
(``MLBENCH_BIND_ADDR``: the pod's IP, so the store is on the pod network and nowhere else).

Under another launcher (torchrun, srun, mpirun: :mod:`mlbench.worker.launcher_env`) rank 0's
host and port come from it; torchrun's ranks join through PyTorch's own ``env://`` rendezvous
(which knows torchrun's agent store), the others through a store that rank 0 hosts on its node,
on the interface of ``--iface`` when given. ``--backend mpi`` takes ranks from MPI itself.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from mlbench.errors import UsageError
from mlbench.results.watchdog import collective_timeout_s
from mlbench.run_config import RunConfig
from mlbench.worker.interfaces import choose_interfaces, interface_address
from mlbench.worker.launcher_env import MLBENCH, TORCHRUN, LaunchEnv

RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("MLBENCH_RENDEZVOUS_TIMEOUT", 300)))


def collective_timeout(config: RunConfig) -> datetime.timedelta:
    """torch's timeout of the group's collectives: longer than the watchdog's bounds, so that
    a stalled rank is named by the watchdog (mlbench.results.watchdog) before a peer times out
    waiting for it and is blamed instead."""
    return datetime.timedelta(seconds=collective_timeout_s(config.watchdog_s, RENDEZVOUS_TIMEOUT.total_seconds()))


def _listen(host: str, port: int, backlog: int) -> int:
    """A listening socket on host:port whose descriptor the TCPStore takes over."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog).detach()


def init_group(config: RunConfig, rank: int, store_fd: int | None = None,
               launch: LaunchEnv | None = None, iface: str | None = None) -> None:
    launch = launch or LaunchEnv(rank, None, 0, None, None, MLBENCH)
    device_id = None
    if config.backend == "nccl":  # bind the communicator to this node's GPU of this rank up front
        slot = launch.local_rank if launch.source != MLBENCH else rank
        device_id = torch.device("cuda", slot % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device_id)
    if config.backend == "mpi":
        _init_mpi(config, rank)
        return
    if launch.source != MLBENCH:
        _init_external(config, rank, launch, iface, device_id)
        return
    if iface:
        choose_interfaces(iface, None, config.backend)
    is_master = rank == 0
    addr = os.environ.get("MLBENCH_MASTER_ADDR") or config.master_addr
    port = int(os.environ.get("MLBENCH_MASTER_PORT") or config.master_port)
    if is_master and store_fd is None and os.environ.get("MLBENCH_BIND_ADDR"):
        store_fd = _listen(os.environ["MLBENCH_BIND_ADDR"], port, config.workers * 2)
    _join(config, rank, addr, port, store_fd, device_id)


def _join(config: RunConfig, rank: int, addr: str, port: int, store_fd: int | None,
          device_id: torch.device | None) -> None:
    is_master = rank == 0
    store = dist.TCPStore(addr, port, config.workers, is_master,
                          RENDEZVOUS_TIMEOUT, wait_for_workers=False,
                          master_listen_fd=store_fd if is_master else None)
    dist.init_process_group(config.backend, store=store, rank=rank, world_size=config.workers,
                            timeout=collective_timeout(config), device_id=device_id)


def _init_external(config: RunConfig, rank: int, launch: LaunchEnv, iface: str | None,
                   device_id: torch.device | None) -> None:
    """Join a run started by torchrun, srun or mpirun (gloo or nccl)."""
    if launch.master_addr is None or launch.master_port is None:
        raise UsageError(f"{launch.source} did not say where rank 0 is: set MASTER_ADDR and "
                         "MASTER_PORT for every worker (with mpirun: -x MASTER_ADDR -x MASTER_PORT)")
    choose_interfaces(iface, launch.master_addr, config.backend)
    if launch.source == TORCHRUN:
        dist.init_process_group(config.backend, init_method="env://", rank=rank,
                                world_size=config.workers, timeout=collective_timeout(config),
                                device_id=device_id)
        return
    store_fd = None
    if rank == 0 and iface:  # else the store listens on every interface of rank 0's node
        store_fd = _listen(interface_address(iface), launch.master_port, config.workers * 2)
    _join(config, rank, launch.master_addr, launch.master_port, store_fd, device_id)


def _init_mpi(config: RunConfig, rank: int) -> None:
    """MPI's own rendezvous: the ranks and their number are those mpirun started."""
    dist.init_process_group("mpi", timeout=collective_timeout(config))
    if (dist.get_rank(), dist.get_world_size()) != (rank, config.workers):
        found = (dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
        raise UsageError(f"MPI says this is rank {found[0]} of {found[1]}, but the worker was "
                         f"started as rank {rank} of a run of {config.workers}; start it with "
                         f"mpirun -np {config.workers}")


def leave_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
