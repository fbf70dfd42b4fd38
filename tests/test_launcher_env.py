"""A worker's rank, world size and rendezvous from its launcher's environment; the interfaces."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mlbench.errors import UsageError
from mlbench.worker.interfaces import choose_interfaces, interface_address, interface_towards
from mlbench.worker.launcher_env import (MLBENCH, OPENMPI, SLURM, SLURM_PORT_BASE, TORCHRUN,
                                         check_world_size, expand_nodelist, launcher_env)

TORCHRUN_ENV = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node1",
                "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
# what srun gives task 2 of a 4-task step on nodes gpu07..gpu08 (SLURM_* of an allocation too)
SRUN_ENV = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "4",
            "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_STEP_NODELIST": "gpu[07-08]"}


def test_torchrun_variables_give_rank_world_and_rank_zero():
    assert launcher_env(None, TORCHRUN_ENV) == (3, 4, 1, "node1", 29500, TORCHRUN)


def test_open_mpi_variables_give_the_rank_and_master_from_the_exported_variables():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", **SRUN_ENV}  # mpirun inside a Slurm job
    assert launcher_env(None, env) == (1, 2, 1, "10.0.0.1", 1234, OPENMPI)
    without_master = launcher_env(None, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"})
    assert without_master.master_addr is None and without_master.master_port is None


def test_an_srun_task_finds_rank_zero_on_the_first_node_and_a_port_from_the_job():
    launch = launcher_env(None, SRUN_ENV)
    assert launch == (2, 4, 0, "gpu07", SLURM_PORT_BASE + (123456 % 2000) * 10, SLURM)
    # the batch script of `mlbench run --slurm` names rank 0 and its port itself
    assert launcher_env(None, {**SRUN_ENV, "MASTER_ADDR": "gpu07", "MASTER_PORT": "40000"})[3:5] == ("gpu07", 40000)
    # two steps of one job do not share a port
    assert launcher_env(None, {**SRUN_ENV, "SLURM_STEP_ID": "1"}).master_port == launch.master_port + 1


def test_the_batch_shell_of_a_multi_task_job_is_not_a_worker():
    env = {k: v for k, v in SRUN_ENV.items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(UsageError, match="start the workers with `srun"):
        launcher_env(None, env)
    single = launcher_env(None, {**env, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    assert (single.rank, single.world_size) == (0, 1)


def test_an_explicit_rank_wins_over_the_environment():
    # a local run started from inside a Slurm allocation is still mlbench's own
    assert launcher_env(1, {**SRUN_ENV, **TORCHRUN_ENV}) == (1, None, 0, None, None, MLBENCH)


def test_no_rank_anywhere_is_one_line():
    with pytest.raises(UsageError, match=r"^no rank in this worker.s environment \(looked for RANK and "
                       r"WORLD_SIZE \(torchrun\), OMPI_COMM_WORLD_RANK .* SLURM_PROCID and SLURM_JOB_ID "
                       r"\(srun\)\): give --rank R"):
        launcher_env(None, {})
    with pytest.raises(UsageError, match="RANK='x' is not a number"):
        launcher_env(None, {"RANK": "x", "WORLD_SIZE": "2"})


def test_the_launcher_must_start_the_recorded_number_of_workers():
    check_world_size(launcher_env(None, TORCHRUN_ENV), 4, "/runs/r")
    with pytest.raises(UsageError, match=r"torchrun started 4 worker\(s\) but the run in /runs/r was "
                                         r"recorded for 2; start 2"):
        check_world_size(launcher_env(None, TORCHRUN_ENV), 2, "/runs/r")
    with pytest.raises(UsageError, match="rank 5 is outside the run's 2 worker"):
        check_world_size(launcher_env(5), 2, "/runs/r")


NODELISTS = {
    "localhost": ["localhost"],
    "node[01-03,7],gpu-a": ["node01", "node02", "node03", "node7", "gpu-a"],
    "n[9-11]": ["n9", "n10", "n11"],
    "rack[1-2]-n[08-09]": ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"],
    "a1,b[2]": ["a1", "b2"],
}


@pytest.mark.parametrize("nodelist", NODELISTS)
def test_a_compressed_nodelist_expands_as_slurm_expands_it(nodelist, tmp_path):
    assert expand_nodelist(nodelist) == NODELISTS[nodelist]
    if shutil.which("scontrol"):  # the reference: Slurm's own expansion (needs only a config file)
        conf = tmp_path / "slurm.conf"
        conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost\n")
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}, timeout=60, check=True)
        assert out.stdout.split() == NODELISTS[nodelist]


def test_a_nodelist_that_is_not_one_is_one_line():
    with pytest.raises(UsageError, match="cannot read the Slurm node list"):
        expand_nodelist("n[a-b]")


def test_the_interface_towards_rank_zero_on_this_machine_is_the_loopback():
    assert interface_address("lo") == "127.0.0.1"
    assert interface_towards("127.0.0.1") == "lo"
    env: dict[str, str] = {}
    assert choose_interfaces(None, "localhost", "gloo", env) == "lo" and env == {"GLOO_SOCKET_IFNAME": "lo"}


def test_an_interface_the_user_set_is_kept():
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    assert choose_interfaces(None, "127.0.0.1", "gloo", env) == "ib0"
    env = {}
    assert choose_interfaces("lo", "10.9.9.9", "nccl", env) == "lo"
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_an_interface_that_does_not_exist_is_one_line():
    with pytest.raises(UsageError, match=r"--iface nosuch0: no such network interface on .* \(it has .*lo"):
        choose_interfaces("nosuch0", None, "gloo", {})


def test_a_slurm_steps_tasks_know_every_tasks_address_by_srun_distribution():
    from mlbench.worker.launcher_env import slurm_peers, tasks_per_node

    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("4") == [4]
    step = {"SLURM_PROCID": "1", "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "5",
            "SLURM_STEP_NODELIST": "n[01-02],gpu7", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
            "MASTER_ADDR": "n01", "MASTER_PORT": "29500"}
    assert slurm_peers(step) == "n01:29500,n01:29501,n02:29500,n02:29501,gpu7:29500"
    cyclic = dict(step, SLURM_DISTRIBUTION="cyclic")
    assert slurm_peers(cyclic) == "n01:29500,n02:29500,gpu7:29500,n01:29501,n02:29501"
    with pytest.raises(UsageError, match="do not fit its nodes"):
        slurm_peers(dict(step, SLURM_STEP_TASKS_PER_NODE="2,1,1"))


def test_ports_a_worker_binds_later_are_free_and_never_ephemeral():
    """The ports a JAX coordinator or TensorFlow's servers bind seconds after the supervisor picked
    them come from below the ephemeral range, where no outgoing connection is given one meanwhile."""
    import socket
    from pathlib import Path

    from mlbench.launch.supervisor import free_ports

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    ports = free_ports("127.0.0.1", 8)
    assert len(set(ports)) == 8 and all(p < low for p in ports), (low, ports)
    assert taken.getsockname()[1] not in ports
    for port in ports:   # free indeed
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    taken.close()
