"""The tests' zygote (tests/zygote.py) answers as a fresh `python -m mlbench` would."""

from __future__ import annotations

import os
import subprocess
import sys

from tests import zygote


def fresh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlbench", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_output_and_exit_codes_are_those_of_a_fresh_interpreter(tmp_path):
    env = dict(os.environ, MLBENCH_HOME=str(tmp_path / "home"))
    for args in (["tasks"], ["run", "task9", "2"], ["status", "nosuchrun"], ["bogus"]):
        forked, started = zygote.run(args, env, 120), fresh(*args, env=env)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            started.returncode, started.stdout, started.stderr), args
    assert forked.returncode == 2


def test_the_command_gets_the_callers_directory_environment_and_path(tmp_path):
    package = tmp_path / "plugins"
    package.mkdir()
    (package / "zygote_probe.py").write_text("VALUE = 'from the caller'\n")
    env = dict(os.environ, MLBENCH_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")]))
    # the optimizer plug-in loader imports module:CLASS from sys.path, as a fresh interpreter would
    proc = zygote.run(["check-optimizer", "zygote_probe:VALUE"], env, 120, cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: optimizer plug-in zygote_probe:VALUE: VALUE is not a subclass of "
                                   "mlbench.optim.base.DistributedOptimizer"), proc.stderr
    shown = zygote.run(["status"], env, 120)
    assert shown.returncode == 0 and "No runs yet" in shown.stdout


def test_a_module_started_as_a_pod_or_a_launcher_would_writes_and_exits_as_a_fresh_interpreter(tmp_path):
    """:func:`zygote.popen_module` (a stand-in kubelet's pods, a test's own launcher of workers):
    ``python -m mlbench.worker`` forked by the zygote writes both streams to the log and exits as
    a fresh interpreter does (here a usage error: no run folder)."""
    env = dict(os.environ, MLBENCH_HOME=str(tmp_path / "home"))
    cmd = [sys.executable, "-m", "mlbench.worker"]
    with open(tmp_path / "forked.log", "wb") as log:
        forked = zygote.popen_module(cmd, env, log, cwd=str(tmp_path))
    assert isinstance(forked, zygote.ZygoteProcess)
    with open(tmp_path / "fresh.log", "wb") as log:
        started = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT)
    assert (forked.wait(120), started.wait(120)) == (2, 2)
    assert (tmp_path / "forked.log").read_text() == (tmp_path / "fresh.log").read_text()
    assert "error: the following arguments are required: run_dir" in (tmp_path / "forked.log").read_text()
