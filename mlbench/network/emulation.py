"""The launcher's side of a local run's emulated network: check, start, enter, stop.

:func:`check_local_shaping` runs before a run is recorded: it builds the network for one worker
in throw-away namespaces, exactly as a run will (:mod:`mlbench.network.netns`), so a machine that
cannot shape (no Linux, no iproute2, no user namespaces for a user without root, no netem in the
kernel) is refused with one line and never runs un-emulated under an emulated label.
:class:`LocalNetwork` starts the holder of a run's namespaces, says how each worker enters its
own, and ends it; the kernel frees everything once the holder and the workers are gone.
:class:`PrivateLoopback` is the same holder for one namespace with a loopback only, where the
workers of a framework whose servers listen on every interface (TensorFlow) meet unreachable;
:func:`private_loopback_problem` is its check before a run is recorded.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from mlbench.errors import MlbenchError, UsageError
from mlbench.frameworks import DEFAULT_FRAMEWORK, get_framework
from mlbench.network import netns
from mlbench.network.settings import NetworkSettings
from mlbench.network.tc import describe
from mlbench.safefile import open_append

READY_TIMEOUT_S = 60.0
NETWORK_LOST = "the emulated network ended before the workers (its holder process exited)"
STOP_TIMEOUT_S = 5.0
_TOOLS = ("unshare", "nsenter", "ip", "tc", "mount")


class NetworkError(MlbenchError):
    """The emulated network could not be built or ended while the run needed it."""


def _as_root() -> bool:
    return os.geteuid() == 0


def _unshare(mount: bool = True) -> list[str]:
    """Root creates the namespaces directly; anyone else inside a user namespace of their own.
    An emulated network needs a private mount namespace too (for ``ip netns``); a private
    loopback (``mount=False``) a network namespace alone."""
    user = [] if _as_root() else ["--user", "--map-root-user"]
    mounts = ["--mount", "--propagation", "private"] if mount else []
    return ["unshare", *user, "--net", *mounts]


def _nsenter_user() -> list[str]:
    """nsenter's options that join the holder's user namespace: none as root, who made no user
    namespace; else the user's own, keeping this process's credentials."""
    return [] if _as_root() else ["--user", "--preserve-credentials"]


def _holder_command(arguments: list[str], mount: bool = True) -> list[str]:
    return [*_unshare(mount), sys.executable, "-m", "mlbench.network.netns", *arguments]


def _read_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The holder's one JSON line; ``{}`` when it exited (or hung) without one."""
    assert proc.stdout is not None  # the holder is started with stdout=PIPE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            return json.loads(line) if line.startswith("{") else {}
    return {}


@functools.cache
def _check(needs_netem: bool) -> str | None:
    if not sys.platform.startswith("linux"):
        return (f"network emulation needs Linux network namespaces and tc, which {sys.platform} "
                "does not have; run on Linux, or without --bandwidth/--latency/--jitter/--loss")
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return (f"network emulation needs {', '.join(missing)} (Debian/Ubuntu: apt-get install "
                "iproute2 util-linux); install it, or run without --bandwidth/--latency/--jitter/--loss")
    probe = NetworkSettings(bandwidth_bps=1e9, latency_s=1e-3 if needs_netem else 0.0)
    proc = subprocess.run(_holder_command(["--check", json.dumps(probe.to_dict())]),
                          capture_output=True, text=True, timeout=READY_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if answer.get("ready"):
        return None
    if "error" in answer:
        return str(answer["error"])
    return _no_namespaces(proc.stderr, "the emulated network")


def _no_namespaces(stderr: str, what: str) -> str:
    """Why a holder that printed no answer could not start: most often, no namespaces here."""
    detail = (stderr.strip().splitlines() or ["no output"])[-1]
    if not detail.startswith("unshare:"):  # the namespaces were made; something else failed
        return f"{what} could not be checked: {detail}"
    if _as_root():
        return f"cannot create network namespaces here ({detail}); the kernel needs CONFIG_NET_NS"
    return (f"cannot create network namespaces as an unprivileged user here ({detail}); run as root, "
            "or allow user namespaces (sysctl user.max_user_namespaces=15000, and on Debian/Ubuntu "
            "kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0)")


@functools.cache
def private_loopback_problem() -> str | None:
    """Why this machine cannot give a run's workers a private loopback (None: it can): the same
    holder a run starts, made and ended at once, before the run is recorded."""
    if not sys.platform.startswith("linux"):
        return f"it needs Linux network namespaces, which {sys.platform} does not have"
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"it needs {' and '.join(missing)} (Debian/Ubuntu: apt-get install util-linux)"
    try:
        proc = subprocess.run(_holder_command(["--loopback", "--check"], mount=False), capture_output=True,
                              text=True, timeout=READY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"its check could not run: {err}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    answer = json.loads(lines[-1]) if lines else {}
    if answer.get("ready"):
        return None
    return str(answer.get("error") or _no_namespaces(proc.stderr, "the private loopback"))


def check_local_shaping(settings: NetworkSettings) -> dict[str, Any]:
    """What run.json records as the network of a local run; UsageError when it cannot be done."""
    if settings.shaping != "tc":
        raise UsageError(f"--shaping {settings.shaping} is for runs on a Kubernetes cluster; "
                         "local runs are shaped with tc in network namespaces")
    problem = _check(settings.needs_netem)
    if problem:
        raise UsageError(problem)
    privileges = "root" if _as_root() else "an unprivileged user namespace"
    return {**settings.to_dict(), "mechanism": "netns+tc",
            "detail": (f"each worker in its own network namespace ({privileges}), a veth pair to a "
                       f"bridge; {describe(settings)}")}


_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000


def _setns(path: str, nstype: int) -> None:
    """setns(2) into the namespace at ``path`` (os.setns arrived in Python 3.12)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise NetworkError(f"cannot enter the namespace {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NamespaceHolder:
    """The namespaces of one running local run, held by one process (:mod:`mlbench.network.netns`)
    that lives while its standard input is open and dies with the supervisor."""

    #: What the run's failure says when the holder exits before the workers.
    lost = NETWORK_LOST
    #: What it is, for the error when it cannot be started.
    what = "the emulated network"
    #: Whether the holder has a private mount namespace too (``ip netns`` keeps its names there).
    mounts = True
    master_port = netns.RENDEZVOUS_PORT

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None

    @property
    def master_addr(self) -> str:
        """Where rank 0's rendezvous listens: the loopback, unless the namespaces give it another."""
        return "127.0.0.1"

    def holder_arguments(self) -> list[str]:
        raise NotImplementedError

    def start(self, preexec_fn: Callable[[], None] | None = None) -> None:
        """Make the namespaces; raises NetworkError (and leaves nothing) when it cannot."""
        with open_append(self.log_path) as log:  # mode 600, as every log of a run
            self.proc = subprocess.Popen(
                _holder_command(self.holder_arguments(), self.mounts),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True, preexec_fn=preexec_fn, text=True)
        answer = _read_line(self.proc, READY_TIMEOUT_S)
        if not answer.get("ready"):
            self.stop()
            raise NetworkError(f"{self.what} could not be built: {answer.get('error') or self._why()}")

    def _why(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1] if lines else f"no answer within {READY_TIMEOUT_S:.0f} s"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """End the holder: its namespaces (links and qdiscs) go with it and the workers."""
        if self.proc is None:
            return
        assert self.proc.stdin is not None and self.proc.stdout is not None  # started with pipes
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()



class LocalNetwork(NamespaceHolder):
    """An emulated network: every worker in a network namespace of its own, joined to a bridge by
    a shaped veth pair (:func:`mlbench.network.netns.build`)."""

    def __init__(self, settings: NetworkSettings, workers: int, log_path: Path):
        super().__init__(log_path)
        self.settings = settings
        self.workers = workers

    @property
    def master_addr(self) -> str:
        return netns.address(0)

    def holder_arguments(self) -> list[str]:
        return [str(self.workers), json.dumps(self.settings.to_dict())]

    def worker_command(self, rank: int, command: list[str]) -> list[str]:
        """``command`` run inside worker ``rank``'s namespace (the same pid, no extra process)."""
        user = _nsenter_user()
        return ["nsenter", f"--target={self.pid}", "--mount", *user, "--",
                "ip", "netns", "exec", netns.worker_netns(rank), *command]

    def enter(self, rank: int) -> None:
        """In a worker forked by the supervisor (one thread): join worker ``rank``'s namespaces,
        as :meth:`worker_command` does for a fresh interpreter: the holder's user namespace (not
        root), its mount namespace (where ``ip netns`` keeps the worker's), then the worker's
        network namespace. The working directory is kept, as nsenter keeps it."""
        if self.pid is None:
            raise NetworkError("the emulated network is not running")
        here = os.getcwd()
        if not _as_root():
            _setns(f"/proc/{self.pid}/ns/user", _CLONE_NEWUSER)
        _setns(f"/proc/{self.pid}/ns/mnt", _CLONE_NEWNS)
        _setns(f"{netns.NETNS_DIR}/{netns.worker_netns(rank)}", _CLONE_NEWNET)
        os.chdir(here)

    def set_link(self, rank: int, up: bool) -> None:
        """Take worker ``rank``'s link down or bring it back (``--inject link-down``): its port on
        the bridge, in the holder's namespaces, so the worker's own address, routes and shaping
        stay as they were and traffic flows again once the port is up."""
        if self.pid is None:
            raise NetworkError("the emulated network is not running")
        user = _nsenter_user()
        subprocess.run(["nsenter", f"--target={self.pid}", "--net", "--mount", *user, "--",
                        "ip", "link", "set", netns.port(rank), "up" if up else "down"],
                       check=True, capture_output=True, timeout=10)

    def worker_env(self, rank: int) -> dict[str, str]:
        """gloo's sockets on the worker's link; rank 0's rendezvous store on its address."""
        env = {"GLOO_SOCKET_IFNAME": netns.WORKER_IF}
        if rank == 0:
            env["MLBENCH_BIND_ADDR"] = self.master_addr
        return env


class PrivateLoopback(NamespaceHolder):
    """One network namespace for all the workers of a local run, whose only interface is its own
    loopback: no other process, on this machine or another, can reach a socket in it.

    For a framework whose servers listen on every interface whatever they are told
    (:attr:`mlbench.frameworks.Framework.listens_everywhere`: TensorFlow's gRPC servers bind
    ``0.0.0.0``, and its security notes call an exposed server arbitrary code execution). Inside
    the namespace that is its loopback alone, where the workers meet; the run's files are the
    host's (no mount namespace), as are its processes."""

    lost = "the workers' private network namespace ended before them (its holder process exited)"
    what = "the workers' private network namespace"
    mounts = False

    def holder_arguments(self) -> list[str]:
        return ["--loopback"]

    def worker_command(self, rank: int, command: list[str]) -> list[str]:
        """``command`` run inside the namespace (the same pid, no extra process)."""
        user = _nsenter_user()
        return ["nsenter", f"--target={self.pid}", "--net", *user, "--", *command]

    def enter(self, rank: int) -> None:
        """In a worker forked by the supervisor (one thread): join the holder's user namespace
        (not root) and its network namespace, as :meth:`worker_command` does for a fresh one."""
        if self.pid is None:
            raise NetworkError(f"{self.what} is not running")
        if not _as_root():
            _setns(f"/proc/{self.pid}/ns/user", _CLONE_NEWUSER)
        _setns(f"/proc/{self.pid}/ns/net", _CLONE_NEWNET)

    def set_link(self, rank: int, up: bool) -> None:
        raise NetworkError("a link-down needs an emulated network (--bandwidth/--latency)")

    def worker_env(self, rank: int) -> dict[str, str]:
        """gloo's sockets (the data's torch) on the namespace's loopback."""
        return {"GLOO_SOCKET_IFNAME": "lo"}


def local_network(run_json: dict[str, Any], log_path: Path,
                  preexec_fn: Callable[[], None] | None = None) -> LocalNetwork | PrivateLoopback | None:
    """The started network of a run: the emulated one its run.json asks for; else a private
    loopback for the workers of a framework whose servers listen on every interface; else None
    (the host's loopback, where every other framework binds its sockets itself)."""
    config = run_json["config"]
    workers = int(config["workers"])
    network: LocalNetwork | PrivateLoopback
    if run_json.get("network"):
        network = LocalNetwork(NetworkSettings.from_dict(run_json["network"]), workers, log_path)
    elif workers > 1 and get_framework(config.get("framework", DEFAULT_FRAMEWORK)).listens_everywhere:
        network = PrivateLoopback(log_path)
    else:
        return None
    network.start(preexec_fn)
    return network
