"""Who started this worker: its rank, the world size and where rank 0 is, from the launcher.

A worker is started by mlbench itself (``--rank``, locally or in a pod) or by any standard
launcher, each of which says the same things in its own variables:

- torchrun, and every launcher that follows PyTorch's ``env://`` convention: ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (PyTorch's documentation,
  "torchrun (Elastic Launch)", environment variables);
- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``; MPICH's ``PMI_RANK``/``PMI_SIZE``;
- a task of a Slurm job step (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
  rank 0 being on the first host of the step's node list (Slurm's ``srun`` manual, "OUTPUT
  ENVIRONMENT VARIABLES"; block distribution puts task 0 on the first node).

An explicit ``--rank`` wins over the environment, so a local run started from inside a Slurm
allocation (where ``SLURM_*`` are set) is still mlbench's own.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple
from collections.abc import Mapping

from mlbench.errors import UsageError

MLBENCH, TORCHRUN, OPENMPI, MPICH, SLURM = "mlbench", "torchrun", "openmpi", "mpich", "slurm"
# Slurm tasks without MASTER_PORT agree on a port derived from the job and step ids, below the
# Linux ephemeral range (32768+) so that no outgoing connection holds it.
SLURM_PORT_BASE = 10000
#: every worker's ``host:port`` in rank order, comma-separated: the local supervisor's addresses
#: for the workers of a framework whose every worker listens (TensorFlow's gRPC servers)
PEERS_ENV = "MLBENCH_PEERS"
#: What :func:`launcher_env` looks for, in its order, as a worker without a rank says.
RANK_VARIABLES = ("RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open "
                  "MPI), PMI_RANK and PMI_SIZE (MPICH), SLURM_PROCID and SLURM_JOB_ID (srun)")


class LaunchEnv(NamedTuple):
    """Where this worker stands in the run; ``master_*`` None means the run's own record."""

    rank: int
    world_size: int | None
    local_rank: int
    master_addr: str | None
    master_port: int | None
    source: str = MLBENCH


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise UsageError(f"{name}={env[name]!r} is not a number; check the launcher's environment") from None


def _master(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    addr = env.get("MASTER_ADDR") or env.get("MLBENCH_MASTER_ADDR") or None
    port_text = env.get("MASTER_PORT") or env.get("MLBENCH_MASTER_PORT")
    return addr, (_int({"MASTER_PORT": port_text}, "MASTER_PORT") if port_text else None)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list as host names: ``n[01-03,7],gpu-a`` -> n01 n02 n03 n7 gpu-a.

    The syntax of ``scontrol show hostnames``: comma-separated names, each with any number of
    bracketed groups of numbers and ranges; a range keeps the zero padding of its first bound.
    """
    hosts: list[str] = []
    for name in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip()):
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
            choices = [literal]
            if group:
                choices = [literal + n for n in _expand_group(group, nodelist)]
            expanded = [prefix + choice for prefix in expanded for choice in choices]
        hosts.extend(h for h in expanded if h)
    if not hosts:
        raise UsageError(f"cannot read the Slurm node list {nodelist!r}")
    return hosts


def _expand_group(group: str, nodelist: str) -> list[str]:
    numbers: list[str] = []
    for part in group.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UsageError(f"cannot read the Slurm node list {nodelist!r}")
        if not sep:
            numbers.append(low)
            continue
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers


def _step_nodelist(env: Mapping[str, str]) -> str:
    """The Slurm step's compressed node list (the job's outside a step; "" for none)."""
    return env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""


def _slurm(env: Mapping[str, str]) -> LaunchEnv:
    if "SLURM_STEP_ID" not in env and _int(env, "SLURM_NTASKS") > 1:
        raise UsageError("this is the batch script of a Slurm job of several tasks, not one of its "
                         "tasks: start the workers with `srun python -m mlbench.worker RUN_DIR`")
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    addr, port = _master(env)
    if addr is None:
        nodes = _step_nodelist(env)
        addr = expand_nodelist(nodes)[0] if nodes else "127.0.0.1"
    if port is None:
        job = _int(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else 0
        step = env.get("SLURM_STEP_ID", "0")
        port = SLURM_PORT_BASE + (job % 2000) * 10 + (int(step) if step.isdigit() else 0) % 10
    return LaunchEnv(_int(env, "SLURM_PROCID"), int(world), int(env.get("SLURM_LOCALID", "0")),
                     addr, port, SLURM)


def tasks_per_node(text: str) -> list[int]:
    """Slurm's count of tasks per node, ``2(x3),1`` -> [2, 2, 2, 1] (``SLURM_STEP_TASKS_PER_NODE``)."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise UsageError(f"cannot read the Slurm tasks per node {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_peers(env: Mapping[str, str]) -> str:
    """Every task's ``host:port`` of this Slurm job step, in rank order (:data:`PEERS_ENV`'s
    form), for a framework whose every worker listens (TensorFlow's gRPC servers): task r runs on
    the node srun's distribution gives it (block, srun's default: the first node's tasks first;
    cyclic: one per node in turn) and listens on the step's port (:func:`launcher_env`'s, rank 0's)
    plus its local id, so that the tasks of one node differ and every task knows every other's
    address without asking."""
    launch = _slurm(env)
    assert launch.world_size is not None and launch.master_port is not None
    nodes = _step_nodelist(env)
    hosts = expand_nodelist(nodes) if nodes else ["127.0.0.1"]
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
                              or str(launch.world_size))
    if len(per_node) != len(hosts) or sum(per_node) != launch.world_size:
        raise UsageError(f"the Slurm step's {launch.world_size} tasks do not fit its nodes {nodes!r} with "
                         f"{per_node} tasks each")
    placed: list[tuple[str, int]] = []   # (host, local id) by rank
    if env.get("SLURM_DISTRIBUTION", "block").startswith("cyclic"):
        taken = [0] * len(hosts)
        while len(placed) < launch.world_size:
            for node, host in enumerate(hosts):
                if taken[node] < per_node[node]:
                    placed.append((host, taken[node]))
                    taken[node] += 1
    else:
        placed = [(host, local) for host, count in zip(hosts, per_node) for local in range(count)]
    return ",".join(f"{host}:{launch.master_port + local}" for host, local in placed)


def launcher_env(rank: int | None, env: Mapping[str, str] | None = None) -> LaunchEnv:
    """This worker's place in the run: from ``--rank`` when given, else from its launcher."""
    env = os.environ if env is None else env
    if rank is not None:
        if rank < 0:
            raise UsageError(f"--rank {rank}: a rank is 0 or more")
        return LaunchEnv(rank, None, 0, None, None, MLBENCH)
    if "RANK" in env and "WORLD_SIZE" in env:
        addr, port = _master(env)
        return LaunchEnv(_int(env, "RANK"), _int(env, "WORLD_SIZE"), int(env.get("LOCAL_RANK", "0")),
                         addr, port, TORCHRUN)
    if "OMPI_COMM_WORLD_RANK" in env:
        addr, port = _master(env)
        return LaunchEnv(_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                         int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")), addr, port, OPENMPI)
    if "PMI_RANK" in env and "PMI_SIZE" in env and "SLURM_PROCID" not in env:
        addr, port = _master(env)
        return LaunchEnv(_int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                         int(env.get("MPI_LOCALRANKID", "0")), addr, port, MPICH)
    if "SLURM_PROCID" in env and "SLURM_JOB_ID" in env:
        return _slurm(env)
    raise UsageError(f"no rank in this worker's environment (looked for {RANK_VARIABLES}): give "
                     "--rank R, or start the workers with a launcher that sets them (torchrun, srun, "
                     "mpirun); see docs/slurm-and-torchrun.md")


def check_world_size(launch: LaunchEnv, workers: int, run_dir: str | os.PathLike) -> None:
    """The launcher must start exactly the workers the run was recorded for (its batch size,
    learning rate and data shards depend on that number)."""
    if launch.world_size is not None and launch.world_size != workers:
        raise UsageError(f"{launch.source} started {launch.world_size} worker(s) but the run in "
                         f"{run_dir} was recorded for {workers}; start {workers} (e.g. "
                         f"--nproc-per-node / srun -n {workers}) or record a run for {launch.world_size}")
    if not 0 <= launch.rank < workers:
        raise UsageError(f"rank {launch.rank} is outside the run's {workers} worker(s) (ranks 0..{workers - 1})")
