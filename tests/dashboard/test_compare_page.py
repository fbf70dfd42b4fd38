"""The compare page in Debian's Chromium, on a sweep of twelve configurations: every figure gives
each family its own colour, the PNG charts' (mlbench.results.charts.COLOURS) in the order of the
families, and a table shows only the settings (fingerprint keys) the families differ in, a row
per family with its runs and its colour.

The dashboard is the real `mlbench dashboard` command on recorded task1a runs
(tests/results/recorded.py) whose momentum and batch differ (--set momentum=..., batch_per_worker=...),
with different training times so that their curves are apart. What is checked is what the page
draws: the legends' colours (on the screenshot too) and the table's cells, inside the viewport.
"""

from __future__ import annotations

import pytest
from PIL import Image

from mlbench.results.charts import COLOURS, family_labels
from mlbench.results.compare import comparison_of
from mlbench.results.store import RunStore
from mlbench.tasks.records import spec_to_dict
from mlbench.tasks.registry import TASKS
from tests.dashboard.browsing import BOX, LEGEND, box, in_viewport, inside, rgb, screenshot
from tests.dashboard.conftest import serving
from tests.results.recorded import record_run

WIDTHS = {1280: 900, 1920: 1080}
#: the twelve configurations: (batch per worker, momentum)
SWEEP = [(batch, momentum) for batch in (32, 64) for momentum in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99)]
CHARTS = ("chart-speedup", "chart-cost", "chart-loss", "chart-accuracy", "chart-communication")


def _config(batch: int, momentum: float) -> dict:
    task = spec_to_dict(TASKS["task1a"])
    task["settings"].update(batch_per_worker=batch, momentum=momentum)
    return {"task": task}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare-page")
    store = RunStore(base / "home")
    sweep = []
    for i, (batch, momentum) in enumerate(SWEEP):
        record = record_run(store, workers=1, tta=8.0 + i, wall=9.0 + i, train_time=8.0 + i,
                            config=_config(batch, momentum))
        sweep.append(record.id)
    # the first configuration again on 2 workers: its family has two rows
    twin = record_run(store, workers=2, tta=6.0, wall=7.0, train_time=6.0, config=_config(*SWEEP[0]))
    with serving(base) as lab:
        lab.sweep, lab.twin = sweep + [twin.id], (sweep[0], twin.id)
        yield lab


def _open(lab, page, width: int, ids) -> None:
    page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    page.goto(f"{lab.base}/compare?runs={','.join(ids)}")
    page.wait_for_selector("#chart-communication .uplot")


def _family_of(label: str, families: list[str]) -> int:
    """The index of the family a legend entry belongs to (its label ends with the family's)."""
    (index,) = [i for i, family in enumerate(families)
                if label == family or label.endswith((f", {family}", f"({family})"))]
    return index


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_each_family_has_its_colour_of_the_png_palette_in_every_figure(lab, page, tmp_path, width):
    comparison = comparison_of(lab.store(), tuple(lab.sweep))
    assert len(comparison.families()) == len(COLOURS) == 12
    _open(lab, page, width, lab.sweep)
    labels = family_labels(list(comparison.families()))
    families = [labels[f] for f in comparison.families()]
    palette = [rgb(c) for c in COLOURS]
    for chart in CHARTS:
        legend = page.locator(f"#{chart} .u-legend")
        legend.screenshot(path=tmp_path / f"{chart}-legend.png")  # the whole legend, scrolled to
        shot = Image.open(tmp_path / f"{chart}-legend.png").convert("RGB")
        origin, card = box(page, f"#{chart} .u-legend"), box(page, f"#{chart}")
        entries = [e for e in page.evaluate(LEGEND, chart) if not e["label"].startswith("target")]
        seen = set()
        for entry in entries:
            family = _family_of(entry["label"], families)
            assert entry["colour"] == palette[family], (chart, entry, family)
            seen.add(family)
            assert inside(entry["box"], card), (chart, entry, card)  # not clipped by its card
            left = round(entry["box"]["left"] - origin["left"])
            middle = round((entry["box"]["top"] + entry["box"]["bottom"]) / 2 - origin["top"])
            drawn = {"rgb({}, {}, {})".format(*shot.getpixel((x, middle))) for x in (left, left + 1)}
            assert entry["colour"] in drawn, (chart, entry, drawn)
        assert seen == set(range(12)), (chart, seen)


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_the_configuration_diff_shows_only_the_settings_that_differ(lab, page, tmp_path, width):
    """A row per family, in the order of the tables, with its runs, its colour and its value of
    each fingerprint key the families differ in; no other key."""
    comparison = comparison_of(lab.store(), tuple(lab.sweep))
    differences = comparison.differences()
    assert [key for key, _ in differences] == ["set.batch_per_worker", "set.momentum"]
    _open(lab, page, width, lab.sweep)
    table = page.locator("#config-diff")
    table.wait_for()
    headers = table.locator("thead th").all_inner_texts()
    assert headers[1:] == [key for key, _ in differences]
    rows = table.locator("tbody tr")
    assert rows.count() == len(comparison.families())
    palette = [rgb(c) for c in COLOURS]
    card = box(page, "#config-diff-card")
    shot = screenshot(page, tmp_path / "config-diff.png")
    for i, groups in enumerate(comparison.families().values()):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).locator("a").all_inner_texts() == [run.record.id for g in groups for run in g.runs]
        assert cells.all_inner_texts()[1:] == [values[i] for _, values in differences]
        swatch = cells.nth(0).locator(".swatch")
        assert swatch.evaluate("(node) => getComputedStyle(node).backgroundColor") == palette[i]
        for j in range(cells.count()):
            cell = page.evaluate(BOX, cells.nth(j).element_handle())
            assert in_viewport(page, cell) and inside(cell, card), (i, j, cell, card)
        middle = swatch.bounding_box()
        pixel = shot.getpixel((round(middle["x"] + middle["width"] / 2), round(middle["y"] + middle["height"] / 2)))
        assert "rgb({}, {}, {})".format(*pixel) == palette[i], (i, pixel)


def test_runs_of_one_configuration_show_no_configuration_diff(lab, page, tmp_path):
    _open(lab, page, 1280, lab.twin)
    page.wait_for_selector('table.compare tr[data-workers="2"]')
    assert page.locator("#config-diff-card").is_hidden()
    screenshot(page, tmp_path / "one-family.png")
