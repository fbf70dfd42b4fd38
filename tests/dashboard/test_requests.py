"""Bad requests to the dashboard's API are answered with a 4xx and one readable line, never a 500
(issue 21, item 9), and a run store deleted under a running dashboard is said to be gone.

Real HTTP to the real `mlbench dashboard` command (tests/dashboard/conftest.py) over a store of
its own, which holds one recorded run; no browser: no page is needed to send these requests.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.dashboard.conftest import Lab, serving
from tests.dashboard.test_dashboard import request
from tests.results.recorded import record_run

HUGE = "99999999999999999999"


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    from mlbench.results.store import RunStore

    base = tmp_path_factory.mktemp("dashboard-requests")
    record_run(RunStore(base / "home"), workers=1, tta=1.0, wall=2.0)
    with serving(base) as lab:
        yield lab


def answer(lab: Lab, path: str, *, method: str = "GET", body: object = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Origin": lab.base} if data is not None else {}
    status, raw = request(lab, path, method=method, data=data, headers=headers, auth="bearer")
    return status, json.loads(raw)


def one_line(document: dict) -> str:
    error = document["error"]
    assert isinstance(error, str) and error and "\n" not in error and "Traceback" not in error, document
    return error


def runs_and_folders(lab: Lab) -> tuple[list[str], list[str]]:
    store = lab.store()
    return sorted(r.id for r in store.list()), sorted(p.name for p in store.runs_dir.iterdir())


@pytest.mark.parametrize("query, text", [
    (f"events?since=0:{HUGE}", "expected a byte offset, a whole number from 0 to 9223372036854775807"),
    ("events?since=0:%C2%B2", "expected RANK:OFFSET"),  # a superscript two: a digit to str.isdigit
    ("events?since=rank0", "expected RANK:OFFSET"),
    (f"events?since=0:{'9' * 5000}", "expected a byte offset"),  # past Python's int() digit limit
    (f"events?since={'9' * 5000}:0", "expected RANK:OFFSET"),
    (f"logs/rank-0.log?offset={HUGE}", "expected a byte offset"),
    ("logs/rank-0.log?offset=%C2%B2", "expected a byte offset"),
], ids=["huge", "superscript", "no-colon", "5000-digits", "5000-digit-rank", "log-huge", "log-superscript"])
def test_a_wrong_offset_is_a_400_with_one_line(bare, query, text):
    run = bare.store().list()[0]
    (run.run_dir / "logs" / "rank-0.log").write_text("one line\n")
    status, document = answer(bare, f"/api/runs/{run.id}/{query}")
    assert status == 400 and text in one_line(document), document


PAST_THE_END = [2**44, 2**62, 2**63 - 1]   # 16 TiB: past ext4's largest file; the largest off_t


@pytest.mark.parametrize("offset", PAST_THE_END, ids=["16TiB", "2^62", "2^63-1"])
def test_an_events_cursor_offset_past_the_end_reads_nothing_and_gives_the_end_of_its_last_whole_line(bare, offset):
    """Clamped, not refused (mlbench.results.offsets says why); a line still being written at
    the end is not taken into the cursor, and the dashboard answers the next request."""
    run = bare.store().list()[0]
    events = run.run_dir / "events" / "rank-0.jsonl"
    whole = events.read_bytes()
    try:
        with open(events, "ab") as f:
            f.write(b'{"time": 9, "rank": 0')   # a line still being written
        status, document = answer(bare, f"/api/runs/{run.id}/events?since=0:{offset}")
        assert (status, document) == (200, {"events": [], "next": f"0:{len(whole)}"})
    finally:
        events.write_bytes(whole)
    status, document = answer(bare, f"/api/runs/{run.id}/events?since={document['next']}")
    assert (status, document) == (200, {"events": [], "next": f"0:{len(whole)}"})
    status, document = answer(bare, f"/api/runs/{run.id}/events")
    assert status == 200 and document["events"] and document["next"] == f"0:{len(whole)}"


@pytest.mark.parametrize("offset", PAST_THE_END, ids=["16TiB", "2^62", "2^63-1"])
def test_a_log_offset_past_the_end_reads_nothing_and_gives_the_logs_size(bare, offset):
    run = bare.store().list()[0]
    (run.run_dir / "logs" / "rank-0.log").write_text("one line\n")
    status, document = answer(bare, f"/api/runs/{run.id}/logs/rank-0.log?offset={offset}")
    assert (status, document) == (200, {"name": "rank-0.log", "text": "", "start": 9, "next": 9})
    status, document = answer(bare, f"/api/runs/{run.id}/logs/rank-0.log?offset=0")
    assert (status, document["text"], document["next"]) == (200, "one line\n", 9)


@pytest.mark.parametrize("price", ["nan", "inf", "-1", "cheap"])
def test_a_wrong_price_is_a_400_with_one_line(bare, price):
    run = bare.store().list()[0]
    status, document = answer(bare, f"/api/compare?runs={run.id}&price_per_hour={price}")
    assert status == 400 and f"price per hour {price!r}: give a number of USD" in one_line(document)


@pytest.mark.parametrize("form, field, text", [
    ({"optimizer_options": "rank=2", "optimizer": "powersgd"}, "optimizer_options",
     "send the optimizer's options as a JSON object"),
    ({"where": "mars"}, "where", "where 'mars': runs can be started on 'local'"),
    ({"where": ["local"]}, "where", "where ['local']: runs can be started on 'local'"),
    ({"seed": HUGE}, "seed", f"--seed {HUGE}: give a whole number from 0 to 9223372036854775807"),
    ({"seed": "-1"}, "seed", "--seed -1: give a whole number from 0 to 9223372036854775807"),
])
def test_a_wrong_new_run_is_a_400_with_one_line_and_records_nothing(bare, form, field, text):
    before = runs_and_folders(bare)
    status, document = answer(bare, "/api/runs", method="POST",
                              body={"task": "task0a", "workers": "1", **form})
    assert status == 400, document
    assert text in one_line(document) and list(document["errors"]) == [field], document
    assert runs_and_folders(bare) == before


def test_a_deleted_store_is_said_to_be_gone(bare):
    """Last in the module: it deletes the store under the running dashboard."""
    run = bare.store().list()[0]
    shutil.rmtree(bare.home)
    for path in ("/api/runs", f"/api/runs/{run.id}", f"/api/runs/{run.id}/events"):
        status, document = answer(bare, path)
        assert status == 503, (path, document)
        line = one_line(document)
        assert f"the run store at {bare.home} no longer exists" in line and "read-only" not in line
    status, document = answer(bare, "/api/runs", method="POST", body={"task": "task0a", "workers": "1"})
    assert status in (400, 503), document
    line = one_line(document)
    assert "no longer exists" in line and "read-only" not in line
    assert not bare.home.exists()
