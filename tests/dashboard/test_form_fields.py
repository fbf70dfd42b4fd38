"""The new-run form in Debian's Chromium: a field for every option `mlbench run` declares
(mlbench/launch/options.py, sent by /api/form), runs started with them as the CLI would start
them, and a wrong value's sentence beside its field.

The dashboard is the real `mlbench dashboard` command; the form's runs are real (task2a on
synthetic data, a few steps, in JAX), read back through the dashboard's API and their events.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from mlbench.launch.options import RUN_OPTIONS
from mlbench.results.events import read_run_events
from tests.dashboard.browsing import box, inked, screenshot
from tests.dashboard.conftest import serving
from tests.dashboard.test_dashboard import request

#: the fields issue 59 asks the form for, by their options' names
NEW_FIELDS = ("framework", "bandwidth", "latency", "inject", "repeat", "log_every")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("form-fields")) as lab:
        yield lab


def _open_form(lab, page) -> None:
    page.set_viewport_size({"width": 1360, "height": 900})
    page.goto(lab.base + "/new")
    page.wait_for_selector("body[data-ready]")


def _api(lab, path: str):
    status, body = request(lab, path, auth="bearer")
    assert status == 200, body
    return json.loads(body)


def test_the_form_has_a_field_for_every_declared_option(lab, page, tmp_path):
    """Every option of RUN_OPTIONS but how the CLI follows its runs (--detach, --log-to) is a
    field of the form, made from /api/form's declaration where new.html has none of its own:
    labelled, drawn inside the form, its help beside it; --framework offers its choices."""
    offered = {o["name"]: o for o in _api(lab, "/api/form")["options"]}
    assert list(offered) == [o.name for o in RUN_OPTIONS if o.target != "follow"]
    _open_form(lab, page)
    form = box(page, "#run-form")
    shot = None
    for name in NEW_FIELDS:
        assert not offered[name]["own_field"], name
        page.locator(f"#{name}").scroll_into_view_if_needed()
        shot = screenshot(page, tmp_path / f"field-{name}.png")
        label = box(page, f'label[for="{name}"]')
        field = box(page, f"#{name}")
        assert label and label["drawn"] and field and field["drawn"], name
        assert form["left"] <= label["left"] < label["right"] <= field["left"] < field["right"] <= form["right"], name
        assert inked(shot, label), name
        assert offered[name]["flag"] in page.inner_text(f'#{name} ~ .hint, .field:has(#{name}) .hint'), name
    for name, option in offered.items():
        if not option["own_field"]:
            assert page.locator(f"#{name}").count() == 1, name
    assert page.eval_on_selector_all("#framework option", "os => os.map((o) => o.textContent)") == [
        "pytorch (default)", "jax", "tensorflow"]
    page.screenshot(path=tmp_path / "new-run-form.png", full_page=True)


def test_a_run_from_the_form_is_made_with_its_framework_log_interval_and_repeats(lab, page, tmp_path):
    """JAX, an interval every 5 steps and 2 repeats: two runs of one group (seeds 0 and 1), each
    recorded in JAX with --log-every 5, as the API reads them back, whose workers logged every
    5 steps."""
    _open_form(lab, page)
    page.select_option("#task", "task2a")
    page.fill("#workers", "1")
    page.check('input[name=data][value="synthetic"]')
    page.fill("#max_steps", "10")
    page.select_option("#framework", "jax")
    page.fill("#log_every", "5")
    page.fill("#repeat", "2")
    page.screenshot(path=tmp_path / "filled.png", full_page=True)
    page.click("#start")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{8}$"), timeout=180_000)
    first = page.url.rsplit("/", 1)[1]
    group = _api(lab, f"/api/runs/{first}")["run"]["group_id"]
    runs = [row for row in _api(lab, "/api/runs")["runs"] if row["group_id"] == group]
    assert len(runs) == 2
    specs = [_api(lab, f"/api/runs/{row['id']}")["spec"] for row in runs]
    assert sorted(s["seed"] for s in specs) == [0, 1]
    assert {(s["framework"], s["log_every"], s["max_steps"]) for s in specs} == {("jax", 5, 10)}
    deadline = time.monotonic() + 240
    while any(lab.store().get(row["id"]).active for row in runs) and time.monotonic() < deadline:
        time.sleep(0.5)
    for row in runs:
        record = lab.store().get(row["id"])
        assert record.state == "finished", (record.state, record.reason)
        logged = [e["step"] for e in read_run_events(record.run_dir) if e["name"] == "train/loss"]
        assert logged == [5, 10], logged


@pytest.mark.parametrize("field, value, sentence", [
    ("log_every", "0", "--log-every must be at least 1"),
    ("repeat", "0", "--repeat must be at least 1, not 0"),
    ("latency", "soon", "--latency 'soon': expected a number and a unit"),
    ("inject", "boom:rank=0", "--inject boom:rank=0: the kind is one of kill, stall, slow, link-down"),
])
def test_a_wrong_value_of_a_new_field_is_refused_beside_it(lab, page, tmp_path, field, value, sentence):
    """The CLI's sentence is shown beside the field it concerns (a latency's beside the latency,
    not the bandwidth), in the danger colour, and no run is recorded."""
    before = {r.id for r in lab.store().list()}
    _open_form(lab, page)
    page.select_option("#task", "task2a")
    page.check('input[name=data][value="synthetic"]')
    page.fill(f"#{field}", value)
    page.click("#start")
    error = page.locator(f'.error[data-for="{field}"]')
    page.wait_for_function(f"document.querySelector('.error[data-for=\"{field}\"]').textContent.length > 0")
    assert error.inner_text().startswith(sentence), error.inner_text()
    assert page.inner_text('.error[data-for="form"]') == ""
    assert page.locator(f".field.invalid #{field}").count() == 1
    error.scroll_into_view_if_needed()
    shot = screenshot(page, tmp_path / f"refused-{field}.png")
    where, beside = box(page, f'.error[data-for="{field}"]'), box(page, f"#{field}")
    assert where["drawn"] and where["left"] > beside["right"] and where["top"] < beside["bottom"], (where, beside)
    assert inked(shot, where, red=True)
    assert page.url.endswith("/new")
    assert {r.id for r in lab.store().list()} == before
