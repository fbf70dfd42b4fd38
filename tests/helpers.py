"""Running the real `mlbench` command in a subprocess, as a user would."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests import zygote


def requires(*modules: str):
    """A module's mark: skip its tests when one of ``modules`` is not installed, without importing
    them. Every xdist worker collects every test module, so a module-level ``importorskip`` of
    TensorFlow, JAX, W&B or MLflow cost each worker seconds of CPU that only the worker running
    the module needs; the module imports them in its tests or a module-scoped fixture instead."""
    import pytest

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed)")


def skip_unless_installed(module: str) -> None:
    """``pytest.importorskip(module)`` without importing it in the test process: where the test
    itself only starts processes that import it (TensorFlow takes a pytest worker 5 CPU-seconds)."""
    import pytest

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module} (not installed)")


def mlbench(*args: str, timeout: float = 240, check: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m mlbench ARGS` (forked by tests/zygote.py) with the test's environment (its isolated
    MLBENCH_HOME), or with ``env`` (a run store shared by the tests of a module); ``check``: it succeeded (0, or 3:
    a run that finished without reaching its goal)."""
    proc = zygote.run(list(args), dict(os.environ) if env is None else env, timeout)
    if check and proc.returncode not in (0, 3):
        raise AssertionError(f"mlbench {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_cli(*args: str, fresh: bool = False) -> zygote.ZygoteProcess | subprocess.Popen:
    """`python -m mlbench ARGS` (forked by tests/zygote.py) in the background, in its own session
    (a Ctrl-C for it alone): ``send_signal``, ``poll``, ``wait`` and ``communicate`` as a Popen's.
    ``fresh``: a new interpreter, for a test whose start-up hooks (``sitecustomize`` on its
    PYTHONPATH) must run in the CLI and the ranks it forks."""
    return zygote.start(list(args), dict(os.environ), fresh)


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
             explain: Callable[[], str] | None = None) -> Any:
    """The first true value of ``check()``, asked every ``interval`` seconds for ``timeout``;
    on a timeout the error carries ``explain()``, what the test knows of why (a job's state,
    its logs), as a failure seen only in CI cannot be rerun to look."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    story = f"\n{explain()}" if explain else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{story}")


def stop_while_training(pid: int, run_dir: str | os.PathLike, rank: int, timeout: float = 60) -> None:
    """SIGSTOP rank ``rank`` (process ``pid``) at a moment its last heartbeat says it is training
    past step 0, so that a watchdog judges it by the step bound named in its reason. Stopped in an
    evaluation or a checkpoint (which a task of a few hundred steps reaches often), it would be
    judged by the longer startup bound: the test would race the training loop. The beat is read
    once the process is stopped and again a beat later (one sent over HTTP may land late); in
    another phase the process is continued and stopped again a moment later."""
    from mlbench.launch.processes import process_state
    from mlbench.results.heartbeat import read_beat
    deadline = time.monotonic() + timeout
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: process_state(pid) in ("T", "t", None), 10, f"process {pid} to stop")
        first = read_beat(run_dir, rank)
        time.sleep(1.5)   # a heartbeat's interval and a half
        last = read_beat(run_dir, rank)
        if all(b is not None and b.phase == "training" and b.step > 0 for b in (first, last)):
            return
        os.kill(pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank} was not found training in {timeout}s (last beat {last})")
        time.sleep(0.2)


def assert_survivor_equals_a_one_worker_resume(faulty, reference, from_step: int, steps: int) -> None:
    """A run shrunk to one worker at ``from_step`` (``faulty``: its rank 0's final checkpoint)
    equals ``reference``'s checkpoint at that step (a run of the old size without faults)
    resumed by one worker, in this process, to ``steps``: both train at the one-worker rate rule
    from the same place in the epoch (docs/faults.md's rules for the new size)."""
    import dataclasses

    from mlbench.results.events import EventWriter
    from mlbench.run_config import RunDocument
    from mlbench.worker.trainer import Trainer

    config = dataclasses.replace(RunDocument.load(faulty.run_dir).config, resume_step=from_step, max_steps=steps)
    assert config.workers == 1
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads_per_worker)   # the worker's own, so sums round alike
    try:
        trainer = Trainer(config, 0, EventWriter(ListSink(), 0), run_dir=reference.run_dir)
        trainer.setup()
        assert trainer.train().steps == steps
    finally:
        torch.set_num_threads(threads)
    expected, actual = trainer.model.state_dict(), checkpoint(faulty, 0)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def run_ids() -> list[str]:
    from mlbench.results.store import RunStore
    return [r.id for r in RunStore().list()]


def last_run():
    from mlbench.results.store import RunStore
    return RunStore().list()[-1]


def checkpoint(run, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(Path(run.run_dir) / "checkpoints" / f"rank-{rank}.pt")


def events(run) -> list[dict]:
    from mlbench.results.events import read_run_events
    return read_run_events(run.run_dir)


def run_json(run) -> dict:
    return json.loads((Path(run.run_dir) / "run.json").read_text())


def install_plugin_package(root: Path, module: str, source: str, distribution: str, group: str,
                           entry_point: str) -> None:
    """An installed package as pip leaves one, without pip: ``module`` (``package.name``) holding
    ``source`` and its dist-info declaring ``entry_point`` (``NAME = module:ATTR``) in ``group``;
    ``distribution`` is ``name-version``. The caller puts ``root`` on sys.path."""
    import textwrap

    package, name = module.split(".")
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    (root / package / f"{name}.py").write_text(textwrap.dedent(source))
    dist_name, version = distribution.rsplit("-", 1)
    dist = root / f"{distribution}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")


def mount_plugin_configmap(record: dict, files: dict[str, bytes], folder: Path) -> dict:
    """What the kubelet makes of a run's ConfigMap and a worker pod's items (no cluster: the
    projection done as it does it): ``folder`` becomes the pod's run folder, holding run.json
    (with the plug-in ``record``) and each of ``files``; the ConfigMap, for the caller to read."""
    import base64

    from mlbench.launch.k8s_objects import Placement, run_configmap, worker_pod

    configmap = run_configmap("abc", {"config": {"optimizer_plugin": record}}, "ns", files)
    placement = Placement(namespace="ns", image="mlbench/worker", nodes=1, cpu_millis=1000, memory_mib=1000)
    pod = worker_pod("abc", 0, 2, 1, placement, {"metadata": {"name": "c", "uid": "u", "namespace": "ns"}},
                     files=tuple(files))
    volume = next(v["configMap"] for v in pod["spec"]["volumes"] if v["name"] == "run")
    for item in volume["items"]:
        target = folder / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if item["key"] in configmap["data"]:
            target.write_text(configmap["data"][item["key"]])
        else:
            target.write_bytes(base64.b64decode(configmap["binaryData"][item["key"]]))
    return configmap


class ListSink:
    """An event sink that keeps a worker's events in a list (a trainer run in the test's process)."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def write(self, event: dict) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process of this machine whose command line can be read now (one
    that ended meanwhile is skipped): what the tests look for leftovers and strays in."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy what ``source`` sends to ``target`` until it ends, then end ``target``'s sending side:
    one direction of a TCP proxy (the tests' port-forwards and the real node's service proxy)."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass
