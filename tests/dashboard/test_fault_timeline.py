"""A run that recovered from a kill, on every surface that shows faults (docs/faults.md): the
result lines of `mlbench run`, the mark in `mlbench status`, the timeline of `status RUN` (the
peer's connection error under the restart it belongs to, not under "Errors"), its ``-o json``,
and the dashboard's run page (the faults card, and a line on the curves at the fault and where
the restart went on from). One real 2-worker task2a run in the module's run store, the
dashboard serving it, Debian's Chromium reading it.
"""

from __future__ import annotations

import json

from tests.helpers import mlbench


def test_a_recovered_kill_shows_on_every_surface_with_its_errors_under_it(lab, page, libsvm_dir, tmp_path):
    proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--set", "batch_per_worker=50",
                   "--log-every", "5", "--no-stop", "--set", "max_epochs=100000", "--max-steps", "2500",
                   "--checkpoint-every", "10steps", "--inject", "kill:rank=1,at=4s", "--on-failure", "restart",
                   env=lab.env, timeout=400)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    (run,) = [r for r in lab.store().list() if r.result and r.result.get("steps") == 2500]
    restart_line = next(line for line in proc.stderr.splitlines() if "restart 1 from step" in line)
    assert restart_line.startswith("mlbench: worker 1 was killed by SIGKILL [injected: kill of rank 1 at 4.0 s")
    assert "Faults: 1 applied, 1 restart, " in proc.stdout and "goodput" in proc.stdout, proc.stdout

    table = mlbench("status", env=lab.env, check=True).stdout
    assert f"{run.id}" in table and "finished (1 restart)" in table, table

    shown = mlbench("status", run.id, env=lab.env, check=True).stdout
    timeline = shown.split("Faults and recovery", 1)[1]
    lines = timeline.splitlines()[1:]
    kill = next(i for i, line in enumerate(lines) if "kill of rank 1 at 4.0 s" in line)
    assert "restart 1 of rank 1 from step" in lines[kill + 1], lines
    peer = lines[kill + 2]
    assert peer.strip().startswith("worker 0: ") and peer.startswith(" " * 13), lines   # under its restart
    assert "Errors:" not in shown, shown   # the run's last group recorded none

    document = json.loads(mlbench("status", run.id, "-o", "json", env=lab.env, check=True).stdout)
    moments = document["timeline"]["moments"]
    assert [m["kind"] for m in moments] == ["fault", "restart"] and document["timeline"]["errors"] == []
    restart = next(m for m in moments if m["kind"] == "restart")
    assert restart["errors"] and restart["errors"][0].startswith("worker 0: ")
    assert restart["step"] == json.loads((run.run_dir / "run.json").read_text())["faults"]["restarts"][0]["from_step"]
    assert document["restarts"] == 1 and any(e.startswith("worker 0: ") for e in document["summary"]["errors"])

    page.goto(f"{lab.base}/runs/{run.id}")
    page.wait_for_selector("#faults-card:not(.hidden) #timeline li[data-kind='restart']")
    items = page.locator("#timeline > li")
    assert [items.nth(i).get_attribute("data-kind") for i in range(items.count())] == ["fault", "restart"]
    assert "worker 0: " in page.inner_text("#timeline li[data-kind='restart'] ul.errors")
    assert page.locator("[data-fact='errors']").count() == 0   # the recovered error is not the run's
    page.wait_for_function("JSON.parse(document.getElementById('chart-time').dataset.marks || '[]').length === 2")
    assert json.loads(page.get_attribute("#chart-time", "data-marks")) == ["fault", "restart"]
    page.screenshot(path=tmp_path / "fault-timeline.png", full_page=True)
