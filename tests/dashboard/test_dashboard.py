"""`mlbench dashboard` in a real browser and over real HTTP, on real runs.

The dashboard is the real command serving on 127.0.0.1 (tests/dashboard/conftest.py); runs are
real task2a runs on a LIBSVM data set the tests write. Figures shown in the pages are checked
against what the library computes from the run store (the numbers `status` and `compare` print).
Each browser test saves a screenshot in its temporary folder.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from mlbench.errors import RunNotFound
from mlbench.results.compare import comparison_of
from mlbench.results.events import read_run_events
from mlbench.results.report import describe_result, fmt_duration
from mlbench.tasks.metrics import ACCURACY

ENDED = ("finished", "failed", "cancelled")


def request(lab, path: str, *, method: str = "GET", headers: dict | None = None,
            data: bytes | None = None, auth: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a request to the dashboard; ``auth``: "bearer" or "cookie"."""
    headers = dict(headers or {})
    if auth == "bearer":
        headers["Authorization"] = f"Bearer {lab.token}"
    elif auth == "cookie":
        headers["Cookie"] = f"mlbench_dashboard_{lab.base.rsplit(':', 1)[1]}={lab.token}"
    req = urllib.request.Request(lab.base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def run_ids(lab) -> set[str]:
    return {r.id for r in lab.store().list()}


# Every (state, evaluations drawn) a run's page shows, in the order it shows them: recorded by
# the page itself (a MutationObserver), so that a slow test loop on a loaded box (a screenshot
# took longer than the run's last seconds of training) misses none of what the page showed.
RECORD_WHAT_THE_PAGE_SHOWS = """
window.__shown = [];
const look = () => {
  const badge = document.querySelector('#state .badge');
  const chart = document.getElementById('chart-time');
  const shown = [badge ? badge.dataset.state : null, chart ? Number(chart.dataset.evaluations || 0) : 0];
  const last = window.__shown[window.__shown.length - 1];
  if (!last || last[0] !== shown[0] || last[1] !== shown[1]) window.__shown.push(shown);
};
new MutationObserver(look).observe(document, {subtree: true, childList: true, attributes: true,
                                               attributeFilter: ['data-state', 'data-evaluations']});
"""
STATE_IS = "(document.querySelector('#state .badge') || {dataset: {}}).dataset.state"


def test_a_run_started_from_the_form_appears_and_its_accuracy_curve_grows(lab, browser, page, libsvm_dir, tmp_path):
    """A run started from the form shows on the runs page opened before it, and its page's
    accuracy curve grows while it trains. Four samples per step (500 steps an epoch on the
    suite's LIBSVM pair) for 6 s: at the task's batch of 100 the run made an epoch, and with it
    an evaluation, every 4 ms (1,806 in its 8 s then), which the dashboard streamed and Chromium
    drew, and the test cost 22 CPU-seconds; a few a second show the curve grow as well. At one
    sample per step (2,000 steps an epoch) a loaded run of the suite evaluated once while it
    trained. What the page showed is recorded by the page (:data:`RECORD_WHAT_THE_PAGE_SHOWS`):
    a loop that read it four times a second saw a single count while a 4-s run trained, on the
    loaded CI box (12 evaluations in all, a third of an idle run's), because its screenshot
    took the run's last second; the page itself, here with two busy loops, drew 4 counts while
    a 4-s run trained (a new look at the store each second), and the run trains 6 s for a margin
    on a slower box."""
    runs_page = browser.new_page()
    runs_page.goto(lab.base + "/")
    runs_page.wait_for_selector("header .live.on")  # subscribed before the run exists
    page.add_init_script(RECORD_WHAT_THE_PAGE_SHOWS)
    page.goto(lab.base + "/new")
    page.wait_for_selector("body[data-ready]")
    page.select_option("#task", "task2a")
    page.fill("#workers", "1")
    page.fill("#data_dir", str(libsvm_dir))
    page.check("#no_stop")
    page.fill("#time_budget", "6s")
    page.fill("#overrides", "max_epochs=100000\nbatch_per_worker=4")
    page.screenshot(path=tmp_path / "new-run-form.png", full_page=True)
    page.click("#start")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{8}$"), timeout=180_000)
    run_id = page.url.rsplit("/", 1)[1]

    # the runs page, opened before, shows the new run without a reload
    runs_page.wait_for_selector(f'#runs tr[data-id="{run_id}"]', timeout=60_000)

    ended = " || ".join(f"{STATE_IS} === '{state}'" for state in ENDED)
    page.wait_for_function(f"({STATE_IS} === 'running' && Number(document.getElementById('chart-time')"
                           f".dataset.evaluations) >= 2) || {ended}", timeout=240_000)
    if page.evaluate(STATE_IS) == "running":
        page.screenshot(path=tmp_path / "run-training.png", full_page=True)
    page.wait_for_function(ended, timeout=240_000)
    seen = [tuple(shown) for shown in page.evaluate("window.__shown")]
    while_running = {count for state, count in seen if state == "running" and count > 0}
    assert len(while_running) >= 2, f"the accuracy curve did not grow while the run trained: {seen}"

    record = lab.store().get(run_id)
    assert record.state == "finished", record.reason
    page.wait_for_function("document.querySelector('#state .badge').dataset.state === 'finished'")
    evaluations = [e for e in read_run_events(record.run_dir) if e["name"] == "eval/accuracy"]
    page.wait_for_function(f"document.querySelector('#chart-time').dataset.evaluations == {len(evaluations)}")
    assert page.inner_text("#result") == describe_result(record.result)
    assert page.inner_text('#progress dd[data-fact="last test accuracy"]') == ACCURACY.format(evaluations[-1]["value"])
    runs_page.wait_for_selector(f'#runs tr[data-id="{run_id}"][data-state="finished"]')
    page.screenshot(path=tmp_path / "run-finished.png", full_page=True)
    runs_page.close()


def test_the_form_refuses_zero_workers_with_the_cli_sentence(lab, page, libsvm_dir, tmp_path):
    import mlbench.cli.commands  # noqa: F401  (registers the commands)
    from mlbench.cli import cli

    cli_error = CliRunner().invoke(cli, ["run", "task2a", "0", "--data-dir", str(libsvm_dir)])
    assert cli_error.exit_code == 2
    sentence = cli_error.stderr.strip().removeprefix("Error: ")
    assert sentence == "the number of workers must be at least 1, not 0"

    before = run_ids(lab)
    page.goto(lab.base + "/new")
    page.wait_for_selector("body[data-ready]")
    page.select_option("#task", "task2a")
    page.fill("#workers", "0")
    page.fill("#data_dir", str(libsvm_dir))
    page.click("#start")
    error = page.locator('.error[data-for="workers"]')
    error.wait_for()
    page.wait_for_function("document.querySelector('.error[data-for=\"workers\"]').textContent.length > 0")
    assert error.inner_text() == sentence
    assert page.url.endswith("/new")
    page.screenshot(path=tmp_path / "form-refuses-k0.png", full_page=True)
    assert run_ids(lab) == before


def test_requests_without_the_token_are_refused(lab):
    for path in ("/api/runs", "/", "/new", "/static/app.css", "/api/stream?runs=1", "/api/form"):
        status, _ = request(lab, path)
        assert status == 401, path
    status, body = request(lab, "/?token=not-the-token")
    assert status == 401
    status, body = request(lab, "/api/runs", headers={"Authorization": "Bearer not-the-token"})
    assert status == 401 and "token" in json.loads(body)["error"]
    # with the token, as a script (bearer) or as the browser (the cookie the address sets)
    assert request(lab, "/api/runs", auth="bearer")[0] == 200
    assert request(lab, "/api/runs", auth="cookie")[0] == 200
    # a name that resolves to 127.0.0.1 but is not this dashboard's (DNS rebinding)
    port = lab.base.rsplit(":", 1)[1]
    assert request(lab, "/api/runs", auth="bearer", headers={"Host": f"evil.example:{port}"})[0] == 403


class _AttackerPage(http.server.BaseHTTPRequestHandler):
    """Another web site (another origin on this machine) whose page posts a form to the dashboard."""

    target = ""

    def do_GET(self):
        body = f"""<!doctype html><html><body>
<form id="attack" method="post" action="{self.target}/api/runs">
<input name="task" value="task2a"><input name="workers" value="1">
<button type="submit" id="go">go</button></form></body></html>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_cross_site_form_post_cannot_start_a_run(lab):
    before = run_ids(lab)
    form = b"task=task2a&workers=1"
    kind = {"Content-Type": "application/x-www-form-urlencoded"}
    # even with the cookie: from another origin, or without the dashboard's own header
    assert request(lab, "/api/runs", method="POST", data=form, auth="cookie",
                   headers={**kind, "Origin": "http://evil.example"})[0] == 403
    assert request(lab, "/api/runs", method="POST", data=form, auth="cookie", headers=kind)[0] == 403
    assert request(lab, "/api/runs", method="POST", data=b"{}", auth="cookie",
                   headers={"Content-Type": "application/json", "X-Mlbench-Dashboard": "1",
                            "Origin": "http://evil.example"})[0] == 403
    assert run_ids(lab) == before


def test_a_form_on_another_origin_cannot_start_a_run_from_the_browser(lab, page, tmp_path):
    """A page of another origin on 127.0.0.1: the same site, so the browser sends the cookie."""
    before = run_ids(lab)
    _AttackerPage.target = lab.base
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AttackerPage)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        page.goto(f"http://127.0.0.1:{attacker.server_address[1]}/")
        with page.expect_navigation() as navigation:
            page.click("#go")
        assert navigation.value.status == 403
        assert "cross-site request" in page.content()
        page.screenshot(path=tmp_path / "cross-site-post.png")
    finally:
        attacker.shutdown()
        attacker.server_close()
    assert run_ids(lab) == before


def test_an_unknown_run_shows_the_not_found_page(lab, page, tmp_path):
    response = page.goto(lab.base + "/runs/0123abcd")
    assert response.status == 404
    assert page.inner_text("#not-found") == "Not found"
    page.screenshot(path=tmp_path / "not-found.png", full_page=True)
    assert page.goto(lab.base + "/no/such/page").status == 404
    status, body = request(lab, "/api/runs/0123abcd", auth="bearer")
    assert status == 404 and "no run '0123abcd'" in json.loads(body)["error"]


def test_the_runs_table_shows_a_finished_task2a_run(lab, page, tmp_path):
    one, _two = lab.finished_runs()
    assert one.state == "finished" and one.task == "task2a" and one.result["reached"]
    page.goto(lab.base + "/")
    row = page.locator(f'#runs tr[data-id="{one.id}"]')
    row.wait_for()
    assert row.get_attribute("data-state") == "finished"
    assert row.locator('[data-col="task"]').inner_text() == "task2a"
    assert row.locator('[data-col="metric"]').inner_text() == ACCURACY.format(one.result["final_accuracy"])
    assert row.locator('[data-col="tta"]').inner_text() == fmt_duration(one.result["time_to_accuracy"])
    assert row.locator('[data-col="epoch"]').inner_text() == f"{one.result['epochs']:.2f}"
    # the filters: task2a and finished keep it, another state hides it
    page.select_option("#filter-state", "finished")
    assert row.is_visible()
    page.screenshot(path=tmp_path / "runs.png", full_page=True)


def test_compare_shows_the_speedup_of_two_runs(lab, page, tmp_path):
    one, two = lab.finished_runs()
    expected = one.result["time_to_accuracy"] / two.result["time_to_accuracy"]
    group = next(g for g in comparison_of(lab.store(), (one.id, two.id)).groups if g.workers == 2)
    assert group.speedup == pytest.approx(expected)
    page.goto(f"{lab.base}/compare?runs={one.id},{two.id}")
    cell = page.locator('table.compare tr[data-workers="2"] td[data-col="SPEEDUP"]')
    cell.wait_for()
    assert cell.inner_text() == f"{expected:.2f}x"
    assert page.inner_text('table.compare tr[data-workers="1"] td[data-col="SPEEDUP"]') == "1.00x"
    page.wait_for_selector("#chart-speedup .uplot")
    speedups = dict(json.loads(page.get_attribute("#chart-speedup", "data-speedups")))
    assert speedups[1] == 1.0 and speedups[2] == pytest.approx(expected)
    page.screenshot(path=tmp_path / "compare.png", full_page=True)


def test_the_api_gives_a_runs_events_since_an_offset(lab):
    one, _ = lab.finished_runs()
    status, body = request(lab, f"/api/runs/{one.id}/events", auth="bearer")
    assert status == 200
    answer = json.loads(body)
    assert answer["events"] == read_run_events(one.run_dir)
    status, body = request(lab, f"/api/runs/{one.id}/events?since={answer['next']}", auth="bearer")
    assert json.loads(body) == {"events": [], "next": answer["next"]}
    status, body = request(lab, f"/api/runs/{one.id}/events?since=rank0", auth="bearer")
    assert status == 400 and "RANK:OFFSET" in json.loads(body)["error"]


def test_a_run_is_deleted_only_after_confirmation(lab, page, tmp_path):
    finished = {r.id for r in lab.finished_runs()}
    victim = next(r for r in lab.store().list() if r.id not in finished)  # the form's run
    page.goto(lab.base + "/")
    row = page.locator(f'#runs tr[data-id="{victim.id}"]')
    row.locator("button.delete").click()
    page.locator("dialog.confirm button.cancel").click()
    assert row.is_visible() and lab.store().get(victim.id)
    row.locator("button.delete").click()
    page.screenshot(path=tmp_path / "delete-confirmation.png")
    page.locator("dialog.confirm button.confirm-yes").click()
    row.wait_for(state="detached")
    with pytest.raises(RunNotFound):
        lab.store().get(victim.id)
