"""`mlbench run --inject` and `--on-failure`: from the words a user types to what run.json records.

``--inject KIND:rank=R,at=T|every=T[,for=T][,factor=F][,seed=S]`` (repeatable) becomes one
schedule dict (:mod:`mlbench.results.faults` says what its keys mean and when it strikes);
``--on-failure fail|restart[:N]|shrink[:N]`` becomes the policy and its limit (restarts, or
shrinks: 0 for ``shrink`` alone, which goes on until one worker is left). Every mistake is a
UsageError of one line naming the option, before anything is recorded.
"""

from __future__ import annotations

import re
from typing import Any

from mlbench.errors import UsageError
from mlbench.launch.plan import parse_duration
from mlbench.results.faults import KILL, KINDS, LINK_DOWN, SLOW, STALL, policy_text  # noqa: F401 (re-exported)

FAIL, RESTART, SHRINK = "fail", "restart", "shrink"
POLICIES = (FAIL, RESTART, SHRINK)
#: Restarts allowed by ``--on-failure restart`` without a count.
DEFAULT_MAX_RESTARTS = 3
_RAND = re.compile(r"^rand\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)$")
_KEYS = ("rank", "at", "every", "for", "factor", "seed")


def _split(body: str) -> list[str]:
    """``a=1,every=rand(1s,2s),b=2`` -> its items (a comma inside rand(...) stays)."""
    items, depth, current = [], 0, ""
    for char in body:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def parse_inject(text: str) -> dict[str, Any]:
    """One ``--inject`` value as its schedule dict (whether its rank is one of the run's workers
    is checked with the run, :func:`mlbench.launch.plan.build_config`)."""
    where = f"--inject {text}"
    kind, _, body = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UsageError(f"{where}: the kind is one of {', '.join(KINDS)} (KIND:rank=R,at=T|every=T)")
    values: dict[str, str] = {}
    for item in _split(body):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in _KEYS:
            raise UsageError(f"{where}: {item!r} is not KEY=VALUE with KEY one of {', '.join(_KEYS)}")
        if key in values:
            raise UsageError(f"{where}: {key} is given twice")
        values[key] = value.strip()
    spec: dict[str, Any] = {"text": f"{kind}:{','.join(f'{k}={v}' for k, v in values.items())}", "kind": kind,
                            "rank": None, "at": None, "every": None, "every_range": None, "for": None,
                            "factor": None, "seed": 0}
    if "rank" not in values:
        raise UsageError(f"{where}: say which worker with rank=R")
    spec["rank"] = _integer(where, "rank", values["rank"])
    if "seed" in values:
        spec["seed"] = _integer(where, "seed", values["seed"])
    if "at" in values:
        spec["at"] = _duration(where, "at", values["at"], zero=True)
    if "every" in values:
        bounds = _RAND.match(values["every"])
        if bounds:
            low, high = (_duration(where, "every", b) for b in bounds.groups())
            if high < low:
                raise UsageError(f"{where}: rand(A,B) needs A <= B")
            spec["every_range"] = [low, high]
        else:
            spec["every"] = _duration(where, "every", values["every"])
    if "for" in values:
        spec["for"] = _duration(where, "for", values["for"])
    if "factor" in values:
        try:
            spec["factor"] = float(values["factor"])
        except ValueError:
            spec["factor"] = 0.0
        if not spec["factor"] > 1.0 or spec["factor"] > 1000:
            raise UsageError(f"{where}: factor={values['factor']}: a number above 1 (3: three times slower), "
                             "at most 1000")
    _check_kind(where, spec, values)
    return spec


def _check_kind(where: str, spec: dict[str, Any], values: dict[str, str]) -> None:
    periodic = "every" in values
    if spec["kind"] in (KILL, STALL, LINK_DOWN) and "at" not in values and not periodic:
        raise UsageError(f"{where}: say when with at=T or every=T (every=rand(60s,120s),seed=3)")
    if spec["kind"] == KILL and ("for" in values or "factor" in values):
        raise UsageError(f"{where}: a kill takes no for= or factor= (the worker is gone)")
    if spec["kind"] == STALL and "factor" in values:
        raise UsageError(f"{where}: a stall takes no factor= (it stops the worker; slow:...,factor=F slows it)")
    if spec["kind"] == LINK_DOWN and ("for" not in values or "factor" in values):
        raise UsageError(f"{where}: a link-down needs for=T (how long the link stays down) and takes no factor=")
    if spec["kind"] == SLOW:
        if spec["factor"] is None:
            raise UsageError(f"{where}: say how much slower with factor=F (3: three times slower)")
        if periodic and "for" not in values:
            raise UsageError(f"{where}: a repeated slowdown needs for=T (how long each one lasts)")
    if "seed" in values and spec["every_range"] is None:
        raise UsageError(f"{where}: seed= seeds a random interval every=rand(A,B); nothing here is random")


def _integer(where: str, key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{where}: {key}={value}: a whole number") from None
    if number < 0:
        raise UsageError(f"{where}: {key}={value}: at least 0")
    return number


def _duration(where: str, key: str, value: str, zero: bool = False) -> float:
    if zero and value.strip() in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(value)
    except UsageError as err:
        raise UsageError(f"{where}: {key}={value}: {err}") from None


def parse_on_failure(text: str) -> tuple[str, int]:
    """``fail`` -> (fail, 0); ``restart`` -> (restart, 3); ``restart:N`` -> (restart, N);
    ``shrink`` -> (shrink, 0): no limit but the workers left; ``shrink:N`` -> (shrink, N)."""
    policy, sep, count = text.strip().lower().partition(":")
    if policy not in POLICIES or (sep and policy == FAIL):
        raise UsageError(f"--on-failure {text}: choose fail, restart[:N] or shrink[:N]", option="on_failure")
    if policy == FAIL:
        return FAIL, 0
    if not sep:
        return policy, DEFAULT_MAX_RESTARTS if policy == RESTART else 0
    try:
        limit = int(count)
    except ValueError:
        limit = -1
    if limit < 1:
        what = "restarts" if policy == RESTART else "shrinks (each leaves one worker fewer)"
        raise UsageError(f"--on-failure {text}: N, the most {what}, is a whole number of at least 1",
                         option="on_failure")
    return policy, limit

