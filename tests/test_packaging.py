"""The package as a user installs it: a wheel built from the source, installed in a fresh
virtual environment (torch from the system's site-packages, as a user with torch installed
has it), whose `mlbench` command lists the tasks and runs a tiny real run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of what the distribution holds (the checkout stays clean:
    setuptools writes build/ and an egg-info beside the sources)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "mlbench", source / "mlbench",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(out), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_is_mlbench_suite_under_apache_2_with_its_license_and_command(wheel):
    assert wheel.name.startswith("mlbench_suite-")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(info).decode())
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert metadata["Name"] == "mlbench-suite"
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "mlbench = mlbench.cli.main:main" in entry_points
    assert "mlbench/results/prices.csv" in names and "mlbench/dashboard/static/runs.html" in names
    assert "mlbench/py.typed" in names
    assert not [n for n in names if n.startswith("tests/")]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    # without a pip of its own: ensurepip would also put an old setuptools in the environment,
    # hiding the system's one that torch requires; this pip installs into it (--python)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    # --no-index: every dependency the wheel declares must be satisfied by the system's packages
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-index", str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return venv


def test_a_fresh_environment_installs_the_wheel_and_runs_mlbench_from_it(venv, tmp_path):
    python, command = venv / "bin" / "python", venv / "bin" / "mlbench"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # outside the checkout, which `python -c` would put first on sys.path
    where = subprocess.run([str(python), "-c", "import mlbench; print(mlbench.__file__)"], env=env, cwd=tmp_path,
                           check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's copy, not the checkout's

    tasks = subprocess.run([str(command), "tasks"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert tasks.returncode == 0, tasks.stderr
    assert [line.split(":")[0] for line in tasks.stdout.splitlines() if line.startswith("task")] == [
        "task0a", "task1a", "task2a", "task3a", "task4b", "task5a"]
    run = subprocess.run([str(command), "run", "task2a", "1", "--data", "synthetic", "--max-steps", "3",
                          "--log-every", "1"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Finished (max-steps): 3 steps" in run.stdout
    (folder,) = (Path(os.environ["MLBENCH_HOME"]) / "runs").iterdir()
    assert (folder / "events" / "rank-0.jsonl").stat().st_size > 0


def test_a_type_checker_reads_the_installed_apis_types(venv, tmp_path):
    """PEP 561: the wheel's py.typed marker makes mypy check a script's calls against mlbench's own
    hints (without it, mypy says the module is untyped and checks nothing)."""
    pytest.importorskip("mypy")
    script = tmp_path / "script.py"
    script.write_text('import mlbench\nfrom mlbench import api\n\nmlbench.runs(limit="3")\n'
                      'reveal_type(api.get("abc").workers)\n')
    # mlbench's modules are read; torch's and the other libraries' are not (a minute of mypy's time)
    (tmp_path / "mypy.ini").write_text("[mypy]\nfollow_imports = skip\nincremental = False\n\n"
                                       "[mypy-mlbench.*]\nfollow_imports = silent\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    checked = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(venv / "bin" / "python"),
                              "--config-file", str(tmp_path / "mypy.ini"), str(script)],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "py.typed" not in checked.stdout and "import-not-found" not in checked.stdout, checked.stdout
    assert 'Argument "limit" to "runs" has incompatible type "str"' in checked.stdout, checked.stdout
    assert re.search(r'Revealed type is "(builtins\.)?int"', checked.stdout), checked.stdout
