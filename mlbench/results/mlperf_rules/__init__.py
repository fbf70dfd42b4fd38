"""The rules MLPerf's own compliance checker applies to mlbench's logs (package data).

MLPerf's checker (``python -m mlperf_logging.compliance_checker``) knows only MLPerf's benchmark
names: given an mlbench log with its default rules it looks for ``closed_task1a.yaml`` and
crashes. Its ``--config`` option takes any rules file by path, and a rules file may queue
further files; ``common.yaml`` here checks what every mlbench log has (submission fields,
``init``/``run`` intervals, ``run_stop``'s status) and queues ``training.yaml`` (epochs,
evaluations, sample counts: tasks 1a to 5a) or nothing more for task 0a, then the benchmark's own
file (``task1a.yaml``...: its goal metric). Queued files are found next to the file the checker
was given (its BEGIN block reads the checker's ``config_file``), so the rules work with any
Python that runs the checker, whether or not it can import mlbench.
"""

from __future__ import annotations

from pathlib import Path

RULES_DIR = Path(__file__).parent
#: The file to give the checker: ``--config <COMMON>``.
COMMON = RULES_DIR / "common.yaml"


def checker_command(log: str | Path, python: str = "python") -> list[str]:
    """The official checker's own command line on ``log`` with mlbench's rules."""
    return [python, "-m", "mlperf_logging.compliance_checker", "--config", str(COMMON), str(log)]
