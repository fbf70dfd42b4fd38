"""A real one-node Slurm cluster on this machine, for the tests of `mlbench run --slurm`.

munged with a test key, slurmctld and slurmd on 127.0.0.1 (ports the OS picks), and a test
slurm.conf (the node "localhost" with this machine's CPUs, one partition, no cgroups, no
accounting daemon: sacct has no data, which the launcher must cope with), all under a temporary
folder; started once per session and stopped at its end, after which no daemon and no job step
of this cluster may be left (the teardown checks). Without Debian's slurmctld, slurmd and munge
packages (.ci/run installs them) the tests skip with the reason.

Also here, for the launcher tests beside the Slurm ones: the reference of the exactness
property, a task2a run by the local launcher whose final parameters and result the other
launchers must reproduce.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = DAEMONS + ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
START_TIMEOUT = 90.0
# the small run every launcher test makes: task2a, 2 workers, a few steps, parameters saved
RUN_ARGS = ("task2a", "2", "--max-steps", "6", "--set", "batch_per_worker=50", "--log-every", "2",
            "--no-stop", "--save-model", "--seed", "3")


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    procs: dict[str, subprocess.Popen]

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, SLURM_CONF=str(self.conf)))
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(root: Path) -> str:
    return f"""ClusterName=mlbenchtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock,cred_expire=15
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
MinJobAge=600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _ours(pid: int, root: Path) -> bool:
    """A process of this test cluster: its command line or environment names our folder."""
    try:
        for name in ("cmdline", "environ"):
            if str(root).encode() in Path(f"/proc/{pid}/{name}").read_bytes():
                return True
    except OSError:
        pass
    return False


def leftovers(root: Path) -> list[str]:
    """Daemons, job steps and workers of this cluster still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and _ours(int(entry.name), root):
            try:
                found.append(f"{(entry / 'comm').read_text().strip()} (pid {entry.name})")
            except OSError:
                continue
    return found


def job_story(cluster: SlurmCluster, run_dir: Path, lines: int = 15) -> str:
    """What a test that waited in vain can tell of a run's job: the queue with each job's state
    and reason, and the last lines of every log in the run's ``logs`` folder."""
    queue = cluster.command("squeue", "--all", "--format=%i %j %T %r %M", check=False)
    story = [f"squeue:\n{queue.stdout.strip()}{queue.stderr.strip()}"]
    try:   # the injected faults as the job's supervisor recorded them (a stall's SIGCONT, say)
        story.append(f"faults: {json.loads((run_dir / 'run.json').read_text()).get('faults')}")
    except (OSError, ValueError) as err:
        story.append(f"faults: run.json unreadable ({err})")
    for beat in sorted((run_dir / "heartbeats").glob("*")):
        story.append(f"{beat.name}: {beat.read_text(errors='replace')[:300]}")
    for log in sorted((run_dir / "logs").glob("*")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        story.append(f"{log.name}:\n" + "\n".join(tail))
    return "\n".join(story)


def cancel_every_job(cluster: SlurmCluster, timeout: float = 30) -> list[str]:
    """scancel every job still queued or running and wait for them to leave; returns their
    squeue lines (empty when there were none)."""
    if "slurmctld" not in cluster.procs or cluster.procs["slurmctld"].poll() is not None:
        return []
    queued = lambda: cluster.command("squeue", "--noheader", "--states=PENDING,RUNNING,COMPLETING",
                                     check=False).stdout.strip()
    jobs = queued()
    if jobs:
        cluster.command("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and queued():
            time.sleep(0.5)
    return jobs.splitlines()


def _stop(cluster: SlurmCluster) -> list[str]:
    """Cancel every job, stop the daemons; returns what was still alive after that (then killed)."""
    cancel_every_job(cluster)
    for name in reversed(DAEMONS):
        proc = cluster.procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    left = leftovers(cluster.root)
    for process in left:  # job steps are slurmd's grandchildren, not ours
        try:
            os.kill(int(process.split("pid ")[1].rstrip(")")), signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while leftovers(cluster.root) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> SlurmCluster:
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing; Debian: apt-get install "
                    "slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm cluster runs slurmd, which starts job steps as their users: it needs root")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir()
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_config(root))
    env = dict(os.environ, SLURM_CONF=str(conf))
    cluster = SlurmCluster(root, conf, {})
    logs = root / "log"
    commands = {
        "munged": ["munged", "--foreground", "--force", f"--key-file={key}",
                   f"--socket={root}/munge/munge.sock", f"--pid-file={root}/munge/munged.pid",
                   f"--log-file={logs}/munged.log", f"--seed-file={root}/munge/seed"],
        "slurmctld": ["slurmctld", "-D", "-f", str(conf)],
        "slurmd": ["slurmd", "-D", "-N", "localhost", "-f", str(conf)],
    }
    try:
        for name in DAEMONS:
            with open(logs / f"{name}.out", "ab") as out:
                cluster.procs[name] = subprocess.Popen(commands[name], stdout=out, stderr=subprocess.STDOUT,
                                                       stdin=subprocess.DEVNULL, env=env,
                                                       start_new_session=True)
            if name == "munged":
                _wait(lambda: (root / "munge" / "munge.sock").exists(), cluster, "munged's socket")
        _wait(lambda: cluster.command("sinfo", "--noheader", "--Node", "--format=%T",
                                      check=False).stdout.strip() == "idle", cluster, "an idle node")
    except BaseException:
        _stop(cluster)
        raise
    yield cluster
    left = _stop(cluster)
    assert not left, f"processes of the test cluster outlived it (now killed): {', '.join(left)}"


def _wait(condition, cluster: SlurmCluster, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not condition():
        dead = [n for n, p in cluster.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                             for p in sorted((cluster.root / "log").glob("*")))
            raise RuntimeError(f"the test Slurm cluster did not come up ({what}; exited: {dead})\n{logs}")
        time.sleep(0.3)


@pytest.fixture(scope="session", autouse=True)
def _zygote_before_the_cluster() -> None:
    """The tests' zygote (tests/zygote.py) starts with the environment of its first use: started
    inside a test, it would carry SLURM_CONF and be taken for a leftover of the cluster."""
    from tests.helpers import mlbench

    mlbench("--version")


@pytest.fixture
def slurm(slurm_cluster, monkeypatch) -> Iterator[SlurmCluster]:
    """The session's cluster, as the current Slurm of this test (SLURM_CONF). A job the test
    left running (one that failed half-way, before its own cancel) is cancelled after it, so
    that it does not hold the node's CPUs while the next tests' jobs wait in the queue."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    yield slurm_cluster
    cancel_every_job(slurm_cluster)


@dataclass
class Reference:
    """A local run of RUN_ARGS: what every launcher must reproduce exactly."""

    stdout: str
    result: dict
    parameters: list[dict[str, torch.Tensor]]


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory, libsvm_dir) -> Reference:
    base = tmp_path_factory.mktemp("local-reference")
    env = dict(os.environ, MLBENCH_HOME=str(base / "home"), MLBENCH_CONFIG_DIR=str(base / "config"),
               MLBENCH_DATA=str(base / "data"))
    from tests.helpers import mlbench

    proc = mlbench("run", *RUN_ARGS, "--data-dir", str(libsvm_dir), env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next((base / "home" / "runs").iterdir())
    from mlbench.results.events import read_run_events

    result = next(e["value"] for e in read_run_events(run_dir) if e["name"] == "result")
    return Reference(proc.stdout, result, [torch.load(run_dir / "checkpoints" / f"rank-{r}.pt")
                                           for r in range(2)])
