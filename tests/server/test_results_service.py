"""The results service over real HTTP: exactly-once events, restarts without loss, tokens."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from mlbench.results.events import read_rank_events
from mlbench.results.http_sink import HttpSink, run_token
from mlbench.server.eventlog import EventLog
from tests.server.conftest import ADMIN_TOKEN, WORKER_TOKEN, new_run


def batch(rank: int, seqs) -> list[dict]:
    return [{"time": 1.0 + s, "rank": rank, "epoch": 0.0, "step": s, "name": "train/loss",
             "value": float(s), "seq": s} for s in seqs]


def stored(service, run_id: str, rank: int) -> list[dict]:
    return read_rank_events(service.home / "runs" / run_id / "events" / f"rank-{rank}.jsonl")


def test_events_posted_twice_are_stored_once(service):
    run_id = new_run(service)
    path, token = f"/v1/runs/{run_id}/events", run_token(WORKER_TOKEN, run_id)
    assert service.call("POST", path, {"rank": 1, "events": batch(1, range(5))}, token) == \
        (200, {"next_seq": 5})
    # the answer was lost: the worker sends the same batch again, then an overlapping one
    assert service.call("POST", path, {"rank": 1, "events": batch(1, range(5))}, token) == \
        (200, {"next_seq": 5})
    assert service.call("POST", path, {"rank": 1, "events": batch(1, range(3, 8))}, token) == \
        (200, {"next_seq": 8})
    assert [e["seq"] for e in stored(service, run_id, 1)] == list(range(8))
    assert stored(service, run_id, 0) == []
    events_file = service.home / "runs" / run_id / "events" / "rank-1.jsonl"
    assert events_file.stat().st_mode & 0o777 == 0o600

    status, files = service.call("GET", f"/v1/runs/{run_id}/files")
    assert status == 200 and set(files["files"]) == {"run.json", "events/rank-1.jsonl"}


def test_a_mirror_copies_what_stays_and_skips_a_file_gone_since_its_listing(service, tmp_path):
    """A log being written is a partial file renamed when whole (mlbench.safefile): the service
    does not list it, and a file gone between the mirror's listing and its read leaves the copy
    unfinished for the next look, not an error (seen in CI: the pod supervisor kept a restarted
    group's logs while `status` copied the run: 'run ... has no file logs/rank-0.log.1-....part')."""
    from mlbench.launch.k8s_client import DirectUrl, ResultsClient
    from mlbench.launch.k8s_mirror import ClusterStore

    run_id = new_run(service)
    logs = service.home / "runs" / run_id / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "rank-0.log").write_text("whole\n")
    (logs / "rank-0.log.1-b21bec0a.part").write_text("half")
    assert set(service.call("GET", f"/v1/runs/{run_id}/files")[1]["files"]) == {"run.json", "logs/rank-0.log"}

    class ListingThenRemoving(DirectUrl):
        """The service's own answers; the log is removed right after a listing names it."""

        def request(self, method, path, body, headers):
            answer = super().request(method, path, body, headers)
            if path.endswith("/files") and (logs / "rank-0.log").exists():
                (logs / "rank-0.log").unlink()
            return answer

    mirror = ClusterStore(tmp_path / "mirror", "the test's service",
                          ResultsClient(ListingThenRemoving(service.url), ADMIN_TOKEN, "the test's service", "ns"))
    record = mirror.sync_run(run_id)
    assert record.id == run_id and (record.run_dir / "run.json").exists()
    assert not (record.run_dir / "logs" / "rank-0.log").exists()


def test_a_mirrors_copy_of_an_ended_run_is_whole_only_once_its_folder_is_settled(service, tmp_path):
    """A cluster's run ends (here: cancelled) before its pods are gone, and a worker asked to stop
    writes its last lines then: the CLI's copy goes on following the folder until the pod
    supervisor marks it final (SETTLED_FILE), and is left alone after (seen on the loaded CI box:
    `status` kept a checkpoint summary one checkpoint old)."""
    from mlbench.launch.k8s_client import DirectUrl, ResultsClient
    from mlbench.launch.k8s_mirror import COMPLETE_MARK, ClusterStore
    from mlbench.results.store import SETTLED_FILE

    run_id = new_run(service)
    assert service.call("POST", f"/v1/runs/{run_id}/cancel")[0] == 200
    folder = service.home / "runs" / run_id
    (folder / "logs").mkdir(exist_ok=True)
    (folder / "logs" / "rank-1.log").write_text("asked to stop\n")
    mirror = ClusterStore(tmp_path / "mirror", "the test's service",
                          ResultsClient(DirectUrl(service.url), ADMIN_TOKEN, "the test's service", "ns"))
    copy = mirror.sync_run(run_id).run_dir
    assert mirror.get(run_id).state == "cancelled" and not (copy / COMPLETE_MARK).exists()
    with open(folder / "logs" / "rank-1.log", "a") as log:   # the worker's checkpoint, then its last line
        log.write("checkpoint at step 81 written\n")
    (folder / SETTLED_FILE).write_text("1.0\n")
    mirror.sync_run(run_id)
    assert (copy / "logs" / "rank-1.log").read_text() == "asked to stop\ncheckpoint at step 81 written\n"
    assert (copy / COMPLETE_MARK).exists() and (copy / SETTLED_FILE).exists()
    (folder / "logs" / "rank-1.log").write_text("rewritten\n")
    mirror.sync_run(run_id)
    assert (copy / "logs" / "rank-1.log").read_text().endswith("step 81 written\n")   # whole: not looked at again


def test_a_request_without_the_right_token_is_refused(service):
    run_id = new_run(service)
    events = {"rank": 0, "events": batch(0, range(2))}
    assert service.call("GET", "/v1/runs", token=None)[0] == 401
    assert service.call("GET", "/v1/runs", token="not-the-token")[0] == 401
    assert service.call("POST", f"/v1/runs/{run_id}/events", events, token=None)[0] == 401
    assert service.call("POST", f"/v1/runs/{run_id}/events", events, token=ADMIN_TOKEN[:-1])[0] == 401
    assert service.call("POST", f"/v1/runs/{run_id}/events", events, token=WORKER_TOKEN)[0] == 401
    # the worker secret, and a run's own token derived from it, may do nothing else
    for worker in (WORKER_TOKEN, run_token(WORKER_TOKEN, run_id)):
        assert service.call("GET", "/v1/runs", token=worker)[0] in (401, 403)
        assert service.call("DELETE", f"/v1/runs/{run_id}", token=worker)[0] in (401, 403)
        assert service.call("POST", "/v1/runs", {"task": "x"}, token=worker)[0] in (401, 403)
    assert stored(service, run_id, 0) == []
    assert service.call("GET", "/v1/runs")[1]["runs"][0]["id"] == run_id


def numbered_on(seqs: list[int], count: int) -> bool:
    """Whether ``seqs`` are ``count`` consecutive numbers (a sink's, from its first_seq on)."""
    return len(seqs) == count and seqs == list(range(seqs[0], seqs[0] + count))


def test_a_restart_in_the_middle_of_a_run_loses_nothing(service):
    run_id = new_run(service)
    sink = HttpSink(service.url, run_token(WORKER_TOKEN, run_id), run_id, 0, batch_size=20, interval=0.05,
                    first_backoff=0.05, max_backoff=0.2, close_timeout=30)
    total = 600

    def train():
        for step in range(total):
            sink.write({"time": time.time(), "rank": 0, "epoch": step / 100, "step": step,
                        "name": "train/loss", "value": 1.0 / (step + 1)})
            time.sleep(0.004)

    trainer = threading.Thread(target=train)
    trainer.start()
    time.sleep(0.6)
    service.kill()                       # mid-run: batches in flight are lost on the wire
    time.sleep(0.5)
    service.start()
    trainer.join()
    sink.close()
    assert sink.pending == 0
    events = stored(service, run_id, 0)
    assert numbered_on([e["seq"] for e in events], total)
    assert [e["step"] for e in events] == list(range(total))


def test_writing_never_waits_for_a_service_that_is_down(service):
    run_id = new_run(service)
    service.kill()
    sink = HttpSink(service.url, run_token(WORKER_TOKEN, run_id), run_id, 1, batch_size=50, interval=0.05,
                    first_backoff=0.05, max_backoff=0.2, close_timeout=30)
    started = time.perf_counter()
    for step in range(2000):
        sink.write({"time": 0.0, "rank": 1, "epoch": 0.0, "step": step, "name": "x", "value": step})
    assert time.perf_counter() - started < 0.5   # 2,000 events buffered, none sent
    assert sink.pending == 2000
    service.start()
    sink.close()
    assert numbered_on([e["seq"] for e in stored(service, run_id, 1)], 2000)


def test_a_torn_line_from_a_crash_is_cut_before_new_events_are_appended(tmp_path):
    log = EventLog(tmp_path)
    assert log.append("r1", 0, batch(0, range(3))) == 3
    path = log.path("r1", 0)
    with open(path, "a") as f:
        f.write('{"time": 4.0, "rank": 0, "na')      # the service died mid-write
    restarted = EventLog(tmp_path)
    assert restarted.append("r1", 0, batch(0, range(2, 5))) == 5
    assert [e["seq"] for e in read_rank_events(path)] == [0, 1, 2, 3, 4]
    assert path.read_text().count("\n") == 5


def test_a_long_outage_keeps_only_the_newest_events_up_to_a_bound(service, capfd):
    run_id = new_run(service)
    service.kill()
    sink = HttpSink(service.url, run_token(WORKER_TOKEN, run_id), run_id, 0, batch_size=100, interval=0.05,
                    first_backoff=0.05, max_backoff=0.2, close_timeout=30, max_pending=1000)
    for step in range(5000):
        sink.write({"time": 1.0, "rank": 0, "epoch": 0.0, "step": step, "name": "train/loss", "value": 0.5})
    assert sink.pending == 1000 and sink.dropped == 4000
    warnings = [line for line in capfd.readouterr().err.splitlines() if "dropped" in line]
    assert len(warnings) == 1 and "1000" in warnings[0], warnings  # said once, not per event
    service.start()
    sink.close()
    seqs = [e["seq"] for e in stored(service, run_id, 0)]
    assert [e["step"] for e in stored(service, run_id, 0)] == list(range(4000, 5000)) and numbered_on(seqs, 1000)
    assert "4000 metric events were dropped" in capfd.readouterr().err


def test_concurrent_out_of_order_batches_are_each_stored_once_when_acknowledged(service):
    """Batches of one rank that arrive out of order (a sender with several connections, retries
    overtaking each other): every acknowledged event is stored, exactly once, also on retry."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    run_id = new_run(service)
    path, token = f"/v1/runs/{run_id}/events", run_token(WORKER_TOKEN, run_id)
    batches = [list(range(10 * i, 10 * i + 10)) for i in range(300)]
    random.Random(0).shuffle(batches)

    def post(seqs):
        try:
            status, _ = service.call("POST", path, {"rank": 1, "events": batch(1, seqs)}, token)
        except OSError:  # the listen backlog was full: not acknowledged, the sender retries
            return []
        return seqs if status == 200 else []

    with ThreadPoolExecutor(max_workers=60) as pool:
        acknowledged = [s for seqs in pool.map(post, batches) for s in seqs]
    assert len(acknowledged) > 1000  # most of them got through at once
    seqs = [e["seq"] for e in stored(service, run_id, 1)]
    assert len(seqs) == len(set(seqs)) and set(acknowledged) <= set(seqs)
    # every sender retries what it has not seen acknowledged, and some what it has: stored once
    for seqs in batches[:20] + [b for b in batches if not set(b) <= set(acknowledged)]:
        assert post(seqs) == seqs
    events = stored(service, run_id, 1)
    assert sorted(e["seq"] for e in events) == list(range(3000))
    assert all(e["step"] == e["seq"] and e["value"] == float(e["seq"]) for e in events)
    # the answer says up to where the rank's events are complete; a restart recovers it
    assert service.call("POST", path, {"rank": 1, "events": batch(1, [5])}, token) == (200, {"next_seq": 3000})
    service.kill()
    service.start()
    assert service.call("POST", path, {"rank": 1, "events": batch(1, [2999, 3000])}, token) == \
        (200, {"next_seq": 3001})
    assert sorted(e["seq"] for e in stored(service, run_id, 1)) == list(range(3001))


def test_a_gap_left_by_a_sender_is_kept_open_for_the_missing_events(tmp_path):
    log = EventLog(tmp_path)
    assert log.append("r1", 0, batch(0, range(5, 8))) == 0      # 0..4 not here yet
    assert log.append("r1", 0, batch(0, [2, 3])) == 0
    restarted = EventLog(tmp_path)                                # the ranges come back from the file
    assert restarted.append("r1", 0, batch(0, [0, 1, 3, 4, 6])) == 8
    assert sorted(e["seq"] for e in read_rank_events(log.path("r1", 0))) == list(range(8))


def test_a_404_that_is_not_the_services_own_answer_is_sent_again(service):
    """Between the workers and the service (a pod of it being replaced on Kubernetes) something
    answered 404 with an empty body: not the service's refusal ({"error": ...}), so the sink sends
    the batch again instead of giving up on the run's events (seen on the real node)."""
    import http.server
    import urllib.request as request

    run_id = new_run(service)
    answered = []

    class Between(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answered.append(len(answered) < 2)
            if answered[-1]:   # the first two: an empty 404, as no mlbench service answers
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            forwarded = request.Request(service.url + self.path, data=body, method="POST",
                                        headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
            with request.urlopen(forwarded, timeout=30) as answer:
                data = answer.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    between = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Between)
    threading.Thread(target=between.serve_forever, daemon=True).start()
    try:
        sink = HttpSink(f"http://127.0.0.1:{between.server_address[1]}", run_token(WORKER_TOKEN, run_id), run_id, 0,
                        batch_size=10, interval=0.05, first_backoff=0.05, max_backoff=0.2, close_timeout=30)
        for step in range(30):
            sink.write({"time": 0.0, "rank": 0, "epoch": 0.0, "step": step, "name": "x", "value": step})
        sink.close()
    finally:
        between.shutdown()
        between.server_close()
    assert answered[:2] == [True, True]
    assert numbered_on([e["seq"] for e in stored(service, run_id, 0)], 30)


def test_a_run_that_checkpoints_on_the_services_volume_gets_its_own_folder_there_and_loses_it_when_deleted(service):
    """A cluster run's pods mount its folder of the service's checkpoint folder
    (mlbench.launch.k8s_objects.CHECKPOINT_DIR): the service makes it, by its own user and private,
    when the run is recorded (a kubelet would make a missing one as root), only for a run whose
    checkpoint_dir is that folder, and removes it with the run."""
    own = str(service.home / "checkpoints")
    made = {}
    for where in (own, "/etc", None):
        status, record = service.call("POST", "/v1/runs", {
            "task": "task2a", "workers": 2, "division": "closed", "launcher": "kubernetes",
            "run_json": {"task": "task2a", "config": {"workers": 2, "checkpoint_every_steps": 5,
                                                      "checkpoint_dir": where}}}, ADMIN_TOKEN)
        assert status == 200, record
        made[where] = record["id"]
    folder = service.home / "checkpoints" / made[own]
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in (service.home / "checkpoints").iterdir()) == [made[own]]   # none for the others
    assert not (Path("/etc") / made["/etc"]).exists()
    assert service.call("DELETE", f"/v1/runs/{made[own]}", None, ADMIN_TOKEN)[0] == 200
    assert not folder.exists()


def test_a_ranks_worker_started_again_has_every_event_stored(service):
    """A restart of the group (on a cluster: its pods created again) starts a new worker process
    for each rank; its events are new ones, not the earlier process's sent twice (seen on the
    real node: the new group's first 200 steps were dropped), so its sequence goes on past them."""
    run_id = new_run(service)
    for process in range(2):
        sink = HttpSink(service.url, run_token(WORKER_TOKEN, run_id), run_id, 0, batch_size=50, interval=0.05,
                        close_timeout=30)
        for step in range(100 * process, 100 * process + 100):
            sink.write({"time": float(step), "rank": 0, "epoch": 0.0, "step": step, "name": "x", "value": step})
        sink.close()
    assert [e["step"] for e in stored(service, run_id, 0)] == list(range(200))


def read_file(service, run_id: str, offset: str) -> tuple[int, bytes]:
    """(status, body) of ``GET /v1/runs/RUN/file?path=run.json&offset=OFFSET``: its bytes, or an error."""
    request = urllib.request.Request(f"{service.url}/v1/runs/{run_id}/file?path=run.json&offset={offset}",
                                     headers={"X-Mlbench-Token": ADMIN_TOKEN})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_a_file_offset_past_the_end_reads_nothing_and_one_not_up_to_2_63_is_a_400_with_one_line(service):
    """Offsets the file system cannot seek to (ext4's largest file is 16 TiB) read nothing, as
    the dashboard's do (mlbench.results.offsets says why); what is not ASCII digits up to 2^63-1
    is a 400 with one line. Never a 500, never an error in the service's log, and the service
    answers the next request."""
    run_id = new_run(service)
    whole = (service.home / "runs" / run_id / "run.json").read_bytes()
    assert read_file(service, run_id, "0") == (200, whole)
    for offset in (2**44, 2**62, 2**63 - 1, len(whole)):
        assert read_file(service, run_id, str(offset)) == (200, b""), offset
        assert read_file(service, run_id, "1") == (200, whole[1:])
    for offset in ("99999999999999999999", str(2**63), "%C2%B2", "-1", "0x10", "9" * 5000):
        status, body = read_file(service, run_id, offset)
        error = json.loads(body)["error"]
        assert status == 400 and "expected a byte offset, a whole number from 0 to 9223372036854775807" in error \
            and "\n" not in error, (offset, body)
        assert read_file(service, run_id, "0") == (200, whole)
    assert "error handling" not in service.log.read_text()
