"""The runs table a page at a time: `GET /api/runs` answers one page of runs, newest first, with the
cursor of the next page and how many runs there are, and makes only that page's rows, so that its
first answer is quick however many runs the store holds; paging returns every run once while runs
are created; the runs page loads the next page as its end comes into view or "More runs" is
pressed, searches every run through the server, and loads every run before it sorts.

The dashboard is the real `mlbench dashboard` command on recorded task1a runs
(tests/results/recorded.py: a catalog row, run.json and event files each, as workers write them).
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest

from mlbench.results.store import RunStore
from tests.dashboard.conftest import serving
from tests.dashboard.test_dashboard import request
from tests.results.recorded import T0, record_run

MANY = 1000
SOME = 250
#: 3x the 1 s the first page is meant to take on an idle machine (CI is loaded)
FIRST_PAGE_S = 3.0


def _record(store: RunStore, count: int, intervals: int = 0) -> list[str]:
    """``count`` finished runs; ``intervals``: logging intervals worker 0 adds to its events (a run
    of minutes logs a hundred or more; each is read to make the run's row)."""
    ids = []
    for i in range(count):
        record = record_run(store, workers=1 + i % 4, tta=8.0 + i % 7, wall=9.0 + i % 7)
        lines = [json.dumps({"time": T0 + 8.0 * k / intervals, "rank": 0, "epoch": k / intervals, "step": k,
                             "name": name, "value": value}, separators=(",", ":")) + "\n"
                 for k in range(intervals) for name, value in (("train/loss", 2.0 - k / intervals), ("train/lr", 0.1))]
        with open(record.run_dir / "events" / "rank-0.jsonl", "a", encoding="utf-8") as events:  # as FileSink does
            events.writelines(lines)
        ids.append(record.id)
    return ids


def _get(lab, path: str) -> dict:
    status, body = request(lab, path, auth="bearer")
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def _newest_first(store: RunStore) -> list[str]:
    return [r.id for r in sorted(store.list(), key=lambda r: (r.created_at, r.id), reverse=True)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The dashboard on SOME recorded runs (this module's own: conftest's browser logs into it)."""
    base = tmp_path_factory.mktemp("runs-paging")
    _record(RunStore(base / "home"), SOME)
    with serving(base) as lab:
        yield lab


def test_the_first_page_of_a_thousand_runs_is_answered_quickly(tmp_path):
    store = RunStore(tmp_path / "home")
    _record(store, MANY, intervals=200)
    with serving(tmp_path) as lab:
        started = time.monotonic()
        page = _get(lab, "/api/runs")
        took = time.monotonic() - started
    assert took < FIRST_PAGE_S, f"the first page of {MANY} runs took {took:.1f} s"
    assert [row["id"] for row in page["runs"]] == _newest_first(store)[:100]
    assert page["total"] == page["matching"] == MANY and page["next"]
    assert all(row["metric_text"] and row["time_to_accuracy"] for row in page["runs"])  # whole rows


def test_paging_returns_every_run_once_while_runs_are_created(lab):
    store = lab.store()
    before = _newest_first(store)
    seen, cursor, created = [], None, []
    while True:
        page = _get(lab, "/api/runs?limit=40" + (f"&before={quote(cursor)}" if cursor else ""))
        assert len(page["runs"]) <= 40
        seen += [row["id"] for row in page["runs"]]
        created += _record(store, 3)  # newer than every page: they belong to a first page
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == before  # each once, newest first, none of those created meanwhile
    first = _get(lab, "/api/runs?limit=40")
    assert [row["id"] for row in first["runs"]] == _newest_first(store)[:40]
    assert set(created[-13:]) <= {row["id"] for row in first["runs"]}
    assert first["total"] == len(before) + len(created)


def test_a_search_pages_through_the_runs_that_match(lab):
    store = lab.store()
    runs = store.list()
    oldest = min(runs, key=lambda r: (r.created_at, r.id))
    page = _get(lab, f"/api/runs?q={oldest.id.upper()}")
    assert [row["id"] for row in page["runs"]] == [oldest.id] and page["next"] is None
    assert (page["matching"], page["total"]) == (1, len(runs))
    page = _get(lab, f"/api/runs?q={quote(oldest.name.split('-')[0] + ' FINISHED')}&limit=7")
    assert page["matching"] == sum(1 for r in runs if r.state == "finished") and len(page["runs"]) == 7
    for wrong in ("limit=0", "limit=many", "before=yesterday", "before=1.5:not%20an%20id"):
        status, body = request(lab, f"/api/runs?{wrong}", auth="bearer")
        assert status == 400 and "\n" not in json.loads(body)["error"], (wrong, body)


def _rows(page) -> list[str]:
    return page.eval_on_selector_all("#runs tbody tr", "rows => rows.map(r => r.dataset.id)")


def _wait_rows(page, count: int) -> None:
    page.wait_for_function(f"document.querySelectorAll('#runs tbody tr').length === {count}")


def test_the_runs_page_loads_pages_as_it_scrolls_and_searches_and_sorts_every_run(lab, page):
    store = lab.store()
    newest = _newest_first(store)
    total = len(newest)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(lab.base + "/")
    _wait_rows(page, 100)
    assert _rows(page) == newest[:100]
    assert page.locator("#shown").inner_text() == f"100 of {total} runs shown"
    more = page.locator("#more")
    more.scroll_into_view_if_needed()  # the end of the table comes into view: the next page
    _wait_rows(page, 200)
    # the button, clicked where it is (a click that scrolled to it would bring it into view: that
    # loads the last page by itself and hides the button under the click)
    more.dispatch_event("click")
    _wait_rows(page, total)
    assert _rows(page) == newest and more.is_hidden()

    # a new visit starts at the top: a reload may restore the scroll at the table's end, and that
    # view loads every page
    page.goto(lab.base + "/")
    _wait_rows(page, 100)
    oldest = store.get(newest[-1])
    page.locator("#search").fill(oldest.id)  # not loaded: the server finds it
    page.wait_for_function(f"[...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.id).join() "
                           f"=== '{oldest.id}'")
    assert page.locator("#shown").inner_text() == f"1 of {total} runs shown"
    page.locator("#search").fill("")
    _wait_rows(page, 100)

    page.locator("#runs thead th", has_text="Workers").click()  # a sort orders every run
    _wait_rows(page, total)
    workers = {r.id: r.workers for r in store.list()}
    assert [workers[i] for i in _rows(page)] == sorted(workers[i] for i in newest)
