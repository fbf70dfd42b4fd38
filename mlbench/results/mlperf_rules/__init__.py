"""The rules MLPerf's own compliance checker applies to mlbench's logs (package data).

MLPerf's checker (``python -m mlperf_logging.compliance_checker``) knows only MLPerf's benchmark
names: given an mlbench log with its default rules it looks for ``closed_task1a.yaml`` and
crashes. Its ``--config`` option takes any rules file by path, and a rules file may queue
further files; ``common.yaml`` here checks what every mlbench log has (submission fields,
``init``/``run`` intervals, ``run_stop``'s status) and queues ``training.yaml`` (epochs,
evaluations, sample counts: tasks 1a to 5a) or nothing more for task 0a, then the benchmark's own
file (``task1a.yaml``...: its goal metric). Queued files are found next to the file the checker
was given (its BEGIN block reads the checker's ``config_file``), so the rules work with any
Python that runs the checker, whether or not it can import mlbench. ``training.yaml``'s BEGIN
block reads the checker's parsed lines (``loglines``) for ``run_stop``'s status and counts
each key: its END block requires evaluations and ``eval_samples`` of a run that did not abort
only.

Each rule carries its reason in words (``WHY``, a field the checker does not read; the END
block has one per check). The checker reports a failed rule as several lines with its state as
JSON; :func:`explain` turns its report into one line per failed rule: the file, the key, what
failed and the rule's reason.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES_DIR = Path(__file__).parent
#: The file to give the checker: ``--config <COMMON>``.
COMMON = RULES_DIR / "common.yaml"


def checker_command(log: str | Path, python: str = "python") -> list[str]:
    """The official checker's own command line on ``log`` with mlbench's rules."""
    return [python, "-m", "mlperf_logging.compliance_checker", "--config", str(COMMON), str(log)]


@dataclass(frozen=True)
class Rule:
    """A key's rule (``key``) or a file's END block (``key`` None): its checks, the count it
    requires (``req``) and its reasons (``why``: one for a key, one per check of an END block)."""

    file: str
    key: str | None
    checks: tuple[str, ...]
    req: str | None
    why: tuple[str, ...]

    def reason(self, test: str = "") -> str:
        """Why the rule holds; for an END block, why its check ``test`` does."""
        if self.key is None and test in self.checks and len(self.why) == len(self.checks):
            return self.why[self.checks.index(test)]
        return self.why[0] if self.why else ""


def rules(benchmark: str | None = None) -> list[Rule]:
    """The rules the checker applies to a log of ``benchmark``, in its order (None, or a name
    that is no task's: every file)."""
    tasks = sorted(p.stem for p in RULES_DIR.glob("task*.yaml"))
    if benchmark not in tasks:
        names = ["common", "training", *tasks]
    else:
        names = ["common", *([] if benchmark == "task0a" else ["training"]), benchmark]
    found = []
    for name in names:
        path = RULES_DIR / f"{name}.yaml"
        if not path.is_file():
            continue
        for entry in yaml.safe_load(path.read_text()) or []:
            record = entry.get("KEY") or entry.get("END")
            if record is None:
                continue
            found.append(Rule(path.name, record.get("NAME"), tuple(c.strip() for c in _listed(record.get("CHECK"))),
                              record.get("REQ"), tuple(_listed(record.get("WHY")))))
    return found


def _listed(value: Any) -> list[Any]:
    return [] if value is None else value if isinstance(value, list) else [value]


_CHECK = re.compile(r"CHECK for '(.+)' failed in line (\d+):")
_REQUIRED = re.compile(r"Required (EXACTLY_ONE|AT_LEAST_ONE|AT_LEAST\((\d+)\)) occurrence of '(.+)' "
                       r"but found (\d+)(.*)")
_UNPARSED = re.compile(r"WARNING - +\^\^(.*)")
#: what the checker puts between two of its messages
_SEPARATOR = "\n" + "-" * 30 + "\n"


def explain(stderr: str, benchmark: str | None = None) -> list[str]:
    """The checker's report (what its command line writes to stderr) on a log of ``benchmark``
    as one line per failed rule. A message that names no rule of these files (a rules file not
    found) is kept in the checker's words, on one line; a line of the log that does not parse
    is quoted with the parser's reason."""
    lines = [line for line in stderr.splitlines() if not line.startswith(("INFO - ", "ERROR - "))]
    said = [f"a line of the log does not parse ({m.group(1).strip()}): {before.removeprefix('WARNING - ').strip()}"
            for before, line in itertools.pairwise(lines) if (m := _UNPARSED.match(line))]
    starts = [i for i, line in enumerate(lines) if line.startswith("WARNING - ")]
    if not starts:
        return said
    # the messages are one logging record, the last: the parse errors before it are records each
    report = "\n".join([lines[starts[-1]].removeprefix("WARNING - ").strip(), *lines[starts[-1] + 1:]])
    known = rules(benchmark)
    for message in report.split(_SEPARATOR):
        text = [line.strip() for line in message.splitlines() if line.strip()]
        if text and not (said and text[0] == "Log lines had parsing errors."):
            said.append(_explain_message(text, known))
    return said


def _explain_message(text: list[str], known: list[Rule]) -> str:
    first = text[0]
    test = next((line.removeprefix("failed test:").strip() for line in text if line.startswith("failed test:")), "")
    check = _CHECK.fullmatch(first)
    if check:
        key = check.group(1)
        rule = _last([r for r in known if r.key == key and test in r.checks])
        return _line(rule, f"{key} at line {check.group(2)} fails `{test}`", rule.reason() if rule else "")
    required = _REQUIRED.fullmatch(first)
    if required:
        req, at_least, key, found, rest = required.groups()
        how = {"EXACTLY_ONE": "exactly once", "AT_LEAST_ONE": "at least once"}.get(req, f"at least {at_least} times")
        if req == "EXACTLY_ONE" and int(found) > 1 and not rest:
            rest = " (a warning only: every copy has the same value)"
        rule = _last([r for r in known if r.key == key and r.req == req])
        return _line(rule, f"{key} must appear {how}, and the log has it {found} times{rest}",
                     rule.reason() if rule else "")
    if first.startswith("failed test:"):  # an END block's check
        rule = _last([r for r in known if r.key is None and test in r.checks])
        if rule is not None and rule.reason(test):
            return f"{rule.file}: {rule.reason(test)} (at the end of the log, `{test}` is false)"
        return _line(rule, f"at the end of the log, `{test}` is false", "")
    return " ".join(text[:2])


def _last(matches: list[Rule]) -> Rule | None:
    """The rule that counts: a later file's rule for a key replaces an earlier file's."""
    return matches[-1] if matches else None


def _line(rule: Rule | None, what: str, why: str) -> str:
    return (f"{rule.file}: " if rule else "") + what + (f": {why}" if why else "")
