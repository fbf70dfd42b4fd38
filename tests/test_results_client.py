"""The CLI's client of a cluster's results service (mlbench/launch/k8s_client.py) against a real
HTTP server standing in for the API server's proxy: a 503 of the proxy (no ready endpoint: the
service restarts, or a loaded node's kubelet marked it unready for a moment) is asked again for
a while; the service's own errors are reported at once."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlbench.errors import ClusterError
from mlbench.launch import k8s_client
from mlbench.launch.k8s_client import DirectUrl, ResultsClient

NO_ENDPOINTS = (b'{"kind":"Status","status":"Failure",'
                b'"message":"no endpoints available for service \\"mlbench-results:http\\"","code":503}')


@pytest.fixture
def proxy():
    """A server that answers the queued (status, body) pairs in order, then 200 {"ok": true}."""
    answers: list[tuple[int, bytes]] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            status, body = answers.pop(0) if answers else (200, b'{"ok": true}')
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = ResultsClient(DirectUrl(f"http://127.0.0.1:{server.server_address[1]}"), "token", "cluster c",
                           "ns")
    yield client, answers, seen
    server.shutdown()


def test_a_proxy_without_ready_endpoints_is_asked_again_until_the_service_answers(proxy):
    client, answers, seen = proxy
    answers += [(503, NO_ENDPOINTS), (503, NO_ENDPOINTS)]
    assert client.call("POST", "/v1/runs/abc/cancel", {}) == {"ok": True}
    assert seen == ["/v1/runs/abc/cancel"] * 3


def test_a_service_that_stays_unavailable_is_one_sentence_after_the_retry_window(proxy, monkeypatch):
    client, answers, seen = proxy
    monkeypatch.setattr(k8s_client, "UNAVAILABLE_RETRY_SECONDS", 1.0)
    answers += [(503, NO_ENDPOINTS)] * 50
    with pytest.raises(ClusterError) as err:
        client.call("POST", "/v1/runs/abc/cancel", {})
    assert "is not reachable (503: no endpoints available" in str(err.value)
    assert 2 <= len(seen) < 50


def test_the_services_own_error_is_reported_at_once(proxy):
    client, answers, seen = proxy
    answers.append((503, json.dumps({"error": "all connections are busy"}).encode()))
    with pytest.raises(ClusterError) as err:
        client.call("POST", "/v1/runs/abc/cancel", {})
    assert "failed (503: all connections are busy)" in str(err.value) and len(seen) == 1
