"""Where the suite's CPU time goes: ``MLBENCH_TEST_CPU_PROFILE=FILE`` (issue 20, part 6).

On a loaded 2-core box the suite's wall time is set by the CPU work it does (its servers', its
real runs' and its own), not by its waits, so what to shrink is found by CPU-seconds, not by
pytest's ``--durations``. A test's work is spread over processes pytest never waits for (forked
runs, srun's tasks, the kubelet, the Docker engine), so it is measured machine-wide: the busy
time of every core in ``/proc/stat`` from the start of a test's setup to the end of its
teardown. That is exact only in one process on an otherwise idle machine::

    MLBENCH_TEST_CPU_PROFILE=/tmp/cpu.jsonl python3 -m pytest -n 0
    python3 -m tests.cpu_profile /tmp/cpu.jsonl

Each line of FILE is ``{"test", "worker", "start", "wall_s", "cpu_s", "own_cpu_s"}`` (``worker``:
pytest-xdist's worker id, ``start``: the Unix time the test's setup began, which together give
a loaded session's timeline: :func:`timeline`); ``own_cpu_s`` is the CPU time
of the pytest process itself (the test's in-process work: references computed in the test, the
Kubernetes client, imports), which is exact however many tests run beside it, in xdist workers
and on a loaded machine. A module-scoped fixture's cost is counted in the test that built it.
The module's ``__main__`` prints the totals per package and module and the most costly tests.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "MLBENCH_TEST_CPU_PROFILE"
CGROUPS_ENV = "MLBENCH_TEST_CPU_CGROUPS"
#: the fields of /proc/stat's "cpu" line that are work, not waiting: user nice system irq softirq steal
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def own_cpu_seconds() -> float:
    """CPU-seconds this process (all its threads) has spent, in user and kernel mode."""
    times = os.times()
    return times.user + times.system


def busy_cpu_seconds() -> float:
    """CPU-seconds every core of this machine has spent working since it booted."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def cgroup_cpu_seconds(folders: list[str]) -> float:
    """CPU-seconds the processes of these cpuacct cgroups (and of their sub-groups) have spent."""
    return sum(int(Path(folder, "cpuacct.usage").read_text()) for folder in folders) / 1e9


class CpuProfile:
    """A pytest plugin that appends one line per test to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # what a test's ``cpu_s`` counts, chosen once: the cgroups of MLBENCH_TEST_CPU_CGROUPS
        # when it is set, else every core of the machine
        folders = [folder for folder in os.environ.get(CGROUPS_ENV, "").split(":") if folder]
        self.cpu_seconds = (lambda: cgroup_cpu_seconds(folders)) if folders else busy_cpu_seconds

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start, wall, own = time.time(), time.monotonic(), own_cpu_seconds()
        cpu = self.cpu_seconds()
        yield
        line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                "start": round(start, 2), "wall_s": round(time.monotonic() - wall, 2),
                "cpu_s": round(self.cpu_seconds() - cpu, 2), "own_cpu_s": round(own_cpu_seconds() - own, 2)}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")


def register(config) -> None:
    """Adds the plugin when ``MLBENCH_TEST_CPU_PROFILE`` names a file (called by conftest)."""
    if os.environ.get(ENV):
        config.pluginmanager.register(CpuProfile(Path(os.environ[ENV])), "mlbench-cpu-profile")


def report(path: Path, top: int = 40) -> str:
    """The totals of a profile by package and by module, and its ``top`` most costly tests (by
    machine-wide CPU; the pytest process's own CPU beside it)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for line in lines:
        line.setdefault("own_cpu_s", 0.0)   # a profile written before the field was recorded
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    by_package: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for line in lines:
        module = line["test"].split("::", 1)[0]
        package = module.rsplit("/", 1)[0] if module.count("/") > 1 else module
        for total in (by_module[module], by_package[package]):
            total[0] += line["wall_s"]
            total[1] += line["cpu_s"]
            total[2] += line["own_cpu_s"]
    cpu_total = sum(line["cpu_s"] for line in lines)
    wall_total = sum(line["wall_s"] for line in lines)
    own_total = sum(line["own_cpu_s"] for line in lines)
    out = [f"{len(lines)} tests: {wall_total / 60:.1f} min wall, {cpu_total / 60:.1f} CPU-min "
           f"({own_total / 60:.1f} in the pytest processes themselves)", ""]
    for title, table in (("package", by_package), ("module", by_module)):
        out.append(f"{'CPU s':>8} {'own s':>8} {'wall s':>8}  {title}")
        for name, (wall, cpu, own) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            out.append(f"{cpu:8.1f} {own:8.1f} {wall:8.1f}  {name}")
        out.append("")
    out.append(f"{'CPU s':>8} {'own s':>8} {'wall s':>8}  test")
    for line in sorted(lines, key=lambda line: -line["cpu_s"])[:top]:
        out.append(f"{line['cpu_s']:8.1f} {line['own_cpu_s']:8.1f} {line['wall_s']:8.1f}  {line['test']}")
    return "\n".join(out)


def timeline(path: Path) -> str:
    """Per xdist worker, the minutes at which each module's tests began and ended (from the
    session's first test): which unit ended the session, and what each worker waited on."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip() and "start" in line]
    if not lines:
        return "no timeline: the profile was written without start times"
    origin = min(line["start"] for line in lines)
    spans: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        key = (line["worker"], line["test"].split("::", 1)[0])
        begin, end = line["start"] - origin, line["start"] - origin + line["wall_s"]
        span = spans.setdefault(key, [begin, end])
        span[0], span[1] = min(span[0], begin), max(span[1], end)
    out = []
    for (worker, module), (begin, end) in sorted(spans.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        out.append(f"{worker:>5} {begin / 60:6.1f} {end / 60:6.1f} {(end - begin) / 60:5.1f}  {module}")
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1] == "--timeline":
        print(timeline(Path(sys.argv[2])))
    else:
        print(report(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40))
