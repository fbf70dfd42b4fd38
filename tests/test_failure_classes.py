"""Failures that no restart can mend end a run at once (mlbench.worker.failures): the worker says
so by its exit code and, where it can still write, by an ``error/permanent`` event; the one
recovery rule of every supervisor (``injector.next_group``) then gives up under any policy. A full
disk under ``--on-failure restart:3`` ends the run at its first failure with the reason, where it
was retried three times."""

from __future__ import annotations

import errno
import json
import sys

import pytest

from mlbench.errors import DataError, UsageError
from mlbench.launch.injector import next_group
from mlbench.worker.failures import permanent_cause
from tests.results.test_store import on_a_full_store


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise outer from err
    except BaseException as err:
        return err


@pytest.mark.parametrize("err,cause", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device"),
    (_raised_from(RuntimeError("writing the checkpoint"), OSError(errno.ENOSPC, "full")),
     "no space left on the device"),
    (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
    (RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file data/3: "
                  "file write failed"),
     "a file could not be written (torch's writer failed: most often no space left)"),
    (DataError("bad line 3"), "an error in the data"),
    (UsageError("--set x=1: unknown"), "a usage error"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), None),
    (RuntimeError("Connection closed by peer [127.0.0.1]:4000"), None),
    (OSError(errno.ENOENT, "No such file"), None),
])
def test_a_failure_is_permanent_when_no_restart_can_mend_it(err, cause):
    assert permanent_cause(err) == cause


def test_no_policy_restarts_or_shrinks_a_permanent_failure():
    for policy in ("restart", "shrink"):
        assert next_group(policy, 3, [], 2, [1], permanent="no space left on the device") == \
            (None, " (no space left on the device, which no restart can mend)")
    assert next_group("restart", 3, [], 2, [1]) == (None, None)       # a transient failure restarts
    assert next_group("shrink", 3, [], 2, [1]) == ([0], None)
    assert next_group("fail", 0, [], 2, [1], permanent="a usage error") == (None, "")


def test_a_full_disk_ends_a_restart_run_at_once_with_its_reason():
    shell = ('"$1" -m mlbench run task2a 1 --data synthetic --max-steps 100000 --log-every 1 '
             '--on-failure restart:3 >/dev/null 2>"$MLBENCH_HOME.err"; echo "exit $?"; '
             '"$1" -c "from mlbench.results.store import RunStore; import json; '
             'r = RunStore(read_only=True).list()[-1]; '
             'd = json.load(open(r.run_dir / \'run.json\')); '
             'print(json.dumps([r.state, r.reason, len((d.get(\'faults\') or {}).get(\'restarts\') or [])]))"')
    proc = on_a_full_store("1m", shell, sys.executable, timeout=280)
    state, reason, restarts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state == "failed" and restarts == 0, (reason, proc.stdout)
    assert "which no restart can mend)" in reason and "supervisor error" not in reason, reason
    assert "no space left" in reason.lower() or "exit code 4" in reason, reason
