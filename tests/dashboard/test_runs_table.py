"""The runs table in Debian's Chromium (issue "What users see"): it fits its card at 1280 and 1920
px with Cancel and Delete always in view, both ask before they act, and it sorts and searches
while its rows update live.

The dashboard is the real `mlbench dashboard` command on a run store of recorded runs
(tests/results/recorded.py): finished ones with known worker counts and times to goal, on
emulated networks whose labels (as `mlbench status` prints them) make the table wider than its
card at both widths, as real rows did in the audit (1,623 px in a card of 1,392), and active
ones (recorded as running, no process behind them: cancelling one marks it cancelled). Each
test saves its screenshots under its temporary folder and reads them back.
"""

from __future__ import annotations

import re

import pytest

from mlbench.errors import RunNotFound
from mlbench.network.settings import NetworkSettings
from mlbench.results.store import CANCELLED, RUNNING, RunStore
from tests.dashboard.browsing import (accept, dismiss_twice, inked, inside, record_running, requests_to,
                                      screenshot)
from tests.dashboard.conftest import serving
from tests.results.recorded import record_run

WIDTHS = {1280: 900, 1920: 1080}
#: the emulated networks of the recorded runs; their labels widen the NETWORK column
NETWORKS = [NetworkSettings(bandwidth_bps=1e7, latency_s=0.025, jitter_s=0.005, loss_percent=0.5),
            NetworkSettings(bandwidth_bps=1e8, latency_s=0.002, jitter_s=0.0005, loss_percent=0.1)]
#: (workers, time to goal in s, optimizer) of the finished task1a runs, in the order recorded:
#: neither by workers nor by time, and 16 workers sorts before 2 as text, 100 s ("0:01:40") before 9.5 s
FINISHED = [(4, 12.5, "centralized-sgd"), (16, 100.0, "powersgd"), (1, 9.5, "centralized-sgd"),
            (2, 33.0, "powersgd")]


def _running(store: RunStore, *, workers: int, name: str) -> str:
    """A run recorded as running, on the first network."""
    return record_running(store, workers=workers, name=name, network={**NETWORKS[0].to_dict(), "mechanism": "tc"})


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The dashboard on recorded runs (this module's own: conftest's browser logs into it)."""
    base = tmp_path_factory.mktemp("runs-table")
    store = RunStore(base / "home")
    for i, (workers, tta, optimizer) in enumerate(FINISHED):
        record = record_run(store, workers=workers, tta=tta, wall=tta + 2.0, optimizer=optimizer,
                            network={**NETWORKS[i % 2].to_dict(), "mechanism": "tc"})
        store.update(record.id, name=f"{optimizer}-sweep-{workers}w-{record.id[:4]}")
    record_run(store, workers=8, task="task4b", goal=20.0, final=18.4)  # a goal not reached
    _running(store, workers=2, name="task2a-long-running-2w")
    with serving(base) as lab:
        yield lab


def _open(lab, page, width: int):
    page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    page.goto(lab.base + "/")
    count = len(lab.store().list())
    page.wait_for_function(f"document.querySelectorAll('#runs tbody tr').length === {count}")


def _ids(page) -> list[str]:
    return page.eval_on_selector_all("#runs tbody tr", "rows => rows.map(r => r.dataset.id)")


def _header(page, title: str):
    return page.locator("#runs thead th", has_text=re.compile(f"^{title}", re.I))


# Where the actions and the last cells of each row are, in the card's visible box (its border
# box less the borders and the scrollbar), and whether the element is what is drawn at its
# centre (not hidden under a sticky column or clipped by the card).
GEOMETRY = """() => {
  const card = document.querySelector('#runs').closest('.card');
  const outer = card.getBoundingClientRect();
  const left = outer.left + card.clientLeft, top = outer.top + card.clientTop;
  const visible = {left, top, right: left + card.clientWidth, bottom: top + card.clientHeight};
  const headers = [...document.querySelectorAll('#runs thead th')].map(th => th.textContent.trim().toLowerCase());
  const column = (title) => headers.findIndex(h => h.startsWith(title));
  const box = (node) => {
    if (!node) return null;
    const r = node.getBoundingClientRect();
    const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
    return {left: r.left, top: r.top, right: r.right, bottom: r.bottom, drawn: !!hit && node.contains(hit)};
  };
  const rows = [...document.querySelectorAll('#runs tbody tr')].map(tr => ({
    id: tr.dataset.id, state: tr.dataset.state,
    cancel: box(tr.querySelector('button.cancel')), remove: box(tr.querySelector('button.delete')),
    tta: box(tr.cells[column('time to goal')]), created: box(tr.cells[column('created')]),
  }));
  return {visible, rows, scroll: card.scrollLeft, scrollWidth: card.scrollWidth, clientWidth: card.clientWidth,
          viewport: {width: innerWidth, height: innerHeight}};
}"""


def _in_view(box: dict, geometry: dict) -> bool:
    viewport = {"left": 0, "top": 0, "right": geometry["viewport"]["width"],
                "bottom": geometry["viewport"]["height"]}
    return box["drawn"] and inside(box, geometry["visible"]) and inside(box, viewport)


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_cancel_delete_time_to_goal_and_created_are_in_view(lab, page, tmp_path, width):
    """The table is wider than its card and scrolls inside it; every run's Cancel and Delete are
    in the card's visible box without scrolling (and stay there at the right end), and its time
    to goal and created cells are once the table is scrolled to its right end. The screenshots
    show the buttons' ink (Delete's red) where their boxes are."""
    _open(lab, page, width)
    start = page.evaluate(GEOMETRY)
    assert start["scrollWidth"] > start["clientWidth"], "the recorded rows should overflow the card"
    assert start["viewport"]["width"] == width
    assert page.evaluate("document.documentElement.scrollWidth") <= width, "the page itself scrolls sideways"
    shot = screenshot(page, tmp_path / f"runs-{width}.png")
    active = [row for row in start["rows"] if row["state"] == "running"]
    assert active and all(row["cancel"] for row in active)
    for row in start["rows"]:
        assert _in_view(row["remove"], start), (row["id"], row["remove"], start["visible"])
        assert inked(shot, row["remove"], red=True), row["id"]
        if row["cancel"]:
            assert _in_view(row["cancel"], start), (row["id"], row["cancel"], start["visible"])
            assert inked(shot, row["cancel"]), row["id"]

    page.evaluate("() => { const c = document.querySelector('#runs').closest('.card'); c.scrollLeft = c.scrollWidth; }")
    end = page.evaluate(GEOMETRY)
    assert end["scroll"] > 0
    shot = screenshot(page, tmp_path / f"runs-{width}-scrolled.png")
    for row in end["rows"]:
        for cell in ("tta", "created", "remove", "cancel"):
            if row[cell]:
                assert _in_view(row[cell], end), (row["id"], cell, row[cell], end["visible"])
                assert inked(shot, row[cell], red=cell == "remove"), (row["id"], cell)


def test_clicking_a_header_sorts_numerically_and_again_reverses(lab, page, tmp_path):
    _open(lab, page, 1280)
    store = lab.store()
    workers = {r.id: r.workers for r in store.list()}
    tta = {r.id: (r.result or {}).get("time_to_accuracy") for r in store.list()}

    _header(page, "workers").click()
    assert [workers[i] for i in _ids(page)] == sorted(workers.values())
    assert _header(page, "workers").get_attribute("aria-sort") == "ascending"
    assert "\u25b2" in _header(page, "workers").inner_text()
    _header(page, "workers").click()
    assert [workers[i] for i in _ids(page)] == sorted(workers.values(), reverse=True)
    assert _header(page, "workers").get_attribute("aria-sort") == "descending"
    assert "\u25bc" in _header(page, "workers").inner_text()
    assert _header(page, "created").get_attribute("aria-sort") == "none"

    # seconds, not their text ("0:01:40" is 100 s); runs without a time to goal last
    _header(page, "time to goal").click()
    reached = sorted(v for v in tta.values() if v is not None)
    assert [tta[i] for i in _ids(page)] == reached + [None] * (len(tta) - len(reached))
    screenshot(page, tmp_path / "sorted-by-time-to-goal.png")

    # text in natural order, case aside: "powersgd-sweep-2w" before "powersgd-sweep-16w"
    _header(page, "name").click()
    names = {r.id: r.name for r in store.list()}
    shown = [names[i] for i in _ids(page)]
    assert shown == sorted(names.values(), key=lambda name: [int(part) if part.isdigit() else part
                                                             for part in re.split(r"(\d+)", name.lower())])
    assert shown.index(next(n for n in shown if n.startswith("powersgd-sweep-2w"))) \
        < shown.index(next(n for n in shown if n.startswith("powersgd-sweep-16w")))


def test_the_search_filters_rows_and_survives_live_updates_with_the_sort(lab, page, tmp_path):
    """The search matches id, name, task, optimizer and state, in any case, and says how many of
    how many runs it shows; rows the store gains or changes later are sorted and filtered too."""
    _open(lab, page, 1280)
    runs = lab.store().list()
    search = page.locator("#search")
    count = page.locator("#shown")

    def shown_for(text: str) -> set[str]:
        search.fill(text)
        return set(_ids(page))

    assert shown_for("TASK4B") == {r.id for r in runs if r.task == "task4b"}
    assert count.inner_text() == f"1 of {len(runs)} runs shown"
    assert shown_for("PowerSGD") == {r.id for r in runs if r.optimizer == "powersgd"}
    assert shown_for("Running") == {r.id for r in runs if r.state == "running"}
    assert shown_for(runs[0].id.upper()) == {runs[0].id}
    assert shown_for("sweep-16w") == {r.id for r in runs if r.name.startswith("powersgd-sweep-16w")}
    assert shown_for("no such run") == set()
    assert count.inner_text() == f"0 of {len(runs)} runs shown"
    assert page.locator("#no-match").is_visible()

    # sorted by workers, descending, and searching "running": a run that starts is placed by its
    # workers, one that ends leaves, a run that does not match stays out
    shown_for("running")
    _header(page, "workers").click()
    _header(page, "workers").click()
    store = lab.store()
    three = _running(store, workers=3, name="task2a-3w-started-later")
    one = _running(store, workers=1, name="task2a-1w-started-later")
    hidden = record_run(store, workers=5, task="task4b", goal=20.0, final=18.0)
    total = len(runs) + 3
    page.wait_for_function(f"document.getElementById('shown').textContent === '3 of {total} runs shown'")
    workers = {r.id: r.workers for r in store.list()}
    assert [workers[i] for i in _ids(page)] == [3, 2, 1] and hidden.id not in _ids(page)
    store.mark_ended(three, CANCELLED)
    page.wait_for_function(f"document.getElementById('shown').textContent === '2 of {total} runs shown'")
    assert _ids(page)[-1] == one and [workers[i] for i in _ids(page)] == [2, 1]
    assert search.input_value() == "running"
    assert _header(page, "workers").get_attribute("aria-sort") == "descending"
    screenshot(page, tmp_path / "searched.png")


def test_cancel_asks_first_and_nothing_happens_when_dismissed(lab, page, tmp_path):
    store = lab.store()
    run_id = _running(store, workers=2, name="cancel-me-2w")
    _open(lab, page, 1280)
    sent = requests_to(page, r"/api/runs/")
    row = page.locator(f'#runs tr[data-id="{run_id}"]')
    dismiss_twice(page, row.locator("button.cancel"), run_id, "cancel-me-2w", sent)
    assert store.get(run_id).state == RUNNING and row.locator("button.cancel").is_visible()
    accept(page, row.locator("button.cancel"), tmp_path / "confirm-cancel.png")
    row.locator('.badge[data-state="cancelled"]').wait_for()
    assert store.get(run_id).state == "cancelled"
    assert sent == [f"POST {lab.base}/api/runs/{run_id}/cancel"]
    assert row.locator("button.cancel").count() == 0


def test_delete_asks_first_and_nothing_happens_when_dismissed(lab, page, tmp_path):
    store = lab.store()
    victim = record_run(store, workers=2, tta=5.0, wall=6.0)
    _open(lab, page, 1280)
    sent = requests_to(page, r"/api/runs/")
    row = page.locator(f'#runs tr[data-id="{victim.id}"]')
    dismiss_twice(page, row.locator("button.delete"), victim.id, victim.name, sent)
    assert store.get(victim.id) and row.is_visible()
    accept(page, row.locator("button.delete"), tmp_path / "confirm-delete.png")
    row.wait_for(state="detached")
    with pytest.raises(RunNotFound):
        store.get(victim.id)
    assert sent == [f"DELETE {lab.base}/api/runs/{victim.id}"]
