"""How the CLI talks to a cluster's results service: through the Kubernetes API server.

The service has a ClusterIP only, so nothing of it is exposed outside the cluster. The CLI
reaches it through the API server's service proxy
(``/api/v1/namespaces/NS/services/mlbench-results:http/proxy/...``) with the user's own
credentials from mlbench's kubeconfig (certificates, tokens and exec plugins alike), and adds
the service's admin token, which it reads from the Secret with those same credentials.
``MLBENCH_RESULTS_URL`` replaces the proxy by an address the user provides (for example the
local end of ``kubectl port-forward`` or ``kubectl proxy``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, Protocol

from mlbench.errors import ClusterError, MlbenchError, RunNotFound, UsageError
from mlbench.extras import needs
from mlbench.launch.k8s_objects import SERVICE
from mlbench.results.http_sink import TOKEN_HEADER, URL_ENV, from_the_service

TIMEOUT_SECONDS = 60
#: How long a request waits for the service to have a ready endpoint again (a restart, a probe
#: that timed out on a loaded node) before its error is reported.
UNAVAILABLE_RETRY_SECONDS = 30.0


class Transport(Protocol):
    def request(self, method: str, path: str, body: bytes | None,
                headers: dict[str, str]) -> tuple[int, bytes]: ...


def _api_request(api_client: Any, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None, **options: Any) -> Any:
    """A request to the API server on the kubernetes client's own connection pool, with the auth
    headers the client would send (refreshing exec tokens); urllib3's response."""
    with needs("kubernetes"):
        import urllib3

    config = api_client.configuration
    auth = {s["key"]: s["value"] for s in config.auth_settings().values() if s["in"] == "header"}
    return api_client.rest_client.pool_manager.request(
        method, config.host + path, body=body, headers={**(headers or {}), **auth},
        timeout=urllib3.Timeout(connect=10, read=TIMEOUT_SECONDS), **options)


def read_object(api_client: Any, path: str) -> dict[str, Any] | None:
    """One object of the API server as its JSON (``path``: ``/api/v1/namespaces/NS/secrets/NAME``),
    or None when it does not exist; any other refusal is the client's own ``ApiException``.

    A plain GET on the client's connection pool with its credentials, not a typed API class:
    importing ``kubernetes.client.CoreV1Api`` builds some 250 models (about a CPU-second, more
    than the rest of `mlbench status`), which every command on a cluster paid to read one Secret."""
    with needs("kubernetes"):
        from kubernetes.client.exceptions import ApiException

    response = _api_request(api_client, "GET", path, headers={"Accept": "application/json"})
    if response.status == 404:
        return None
    if response.status >= 400:
        raise ApiException(http_resp=response)
    return json.loads(response.data)


class ApiServerProxy:
    """Requests to the service through the API server, authenticated as the user."""

    def __init__(self, api_client: Any, namespace: str):
        self.api = api_client
        self.prefix = f"/api/v1/namespaces/{namespace}/services/{SERVICE}:http/proxy"

    def request(self, method: str, path: str, body: bytes | None,
                headers: dict[str, str]) -> tuple[int, bytes]:
        with needs("kubernetes"):
            import urllib3

        try:
            response = _api_request(self.api, method, self.prefix + path, body, headers, retries=False)
        except urllib3.exceptions.HTTPError as err:
            raise OSError(f"{type(err).__name__}: {str(err)[:200]}") from None
        return response.status, response.data


class DirectUrl:
    """Requests to an address the user gave in $MLBENCH_RESULTS_URL."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: bytes | None,
                headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


def transport_for(api_client: Any, namespace: str) -> Transport:
    url = os.environ.get(URL_ENV)
    return DirectUrl(url) if url else ApiServerProxy(api_client, namespace)


class ResultsClient:
    """JSON calls to the results service; every failure becomes one sentence to act on."""

    def __init__(self, transport: Transport, token: str, where: str, namespace: str):
        self.transport = transport
        self.token = token
        self.where = where
        self.namespace = namespace

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> bytes:
        data = json.dumps(body, default=str).encode() if body is not None else None
        headers = {TOKEN_HEADER: self.token, "Content-Type": "application/json"}
        deadline = time.monotonic() + UNAVAILABLE_RETRY_SECONDS
        pause = 0.5
        while True:
            try:
                status, answer = self.transport.request(method, path, data, headers)
            except OSError as err:
                raise ClusterError(f"Cannot reach the results service of {self.where} ({err}); check "
                                   "that the cluster is up (`mlbench list-clusters`) and retry.") from None
            # 503 from the API server's proxy (not the service's own JSON error): no ready endpoint,
            # the service is starting or was marked unready for a moment; the request never reached
            # it, so asking again is safe for every method
            if status == 503 and not from_the_service(answer) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 4.0)
                continue
            if status >= 400:
                raise self._error(status, answer)
            return answer

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = self._send(method, path, body)
        try:
            return json.loads(answer)
        except ValueError:
            raise ClusterError(f"The results service of {self.where} sent an answer that is not JSON "
                               f"({answer[:100]!r}); check what MLBENCH_RESULTS_URL points to.") from None

    def raw(self, path: str) -> bytes:
        return self._send("GET", path, None)

    def _error(self, status: int, answer: bytes) -> MlbenchError:
        try:
            doc = json.loads(answer)
        except ValueError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        pods = f"kubectl -n {self.namespace} get pods -l app.kubernetes.io/name={SERVICE}"
        if "error" in doc:  # the service itself
            message = str(doc["error"])
            if status == 404:
                return RunNotFound(message)
            if status in (401, 403):
                return ClusterError(f"The results service of {self.where} refused mlbench's token "
                                    f"({message}); check the Secret {SERVICE} in namespace "
                                    f"{self.namespace}.")
            if status == 400:
                return UsageError(message)
            return ClusterError(f"The results service of {self.where} failed ({status}: {message}); "
                                f"retry, and see its log with `kubectl -n {self.namespace} logs "
                                f"deploy/{SERVICE}`.")
        message = str(doc.get("message") or answer[:200].decode(errors="replace")).strip()
        if status in (401, 403):
            return ClusterError(f"Your Kubernetes credentials may not reach the results service of "
                                f"{self.where} ({status}: {message}); ask for `get` and `create` on "
                                f"services/proxy in namespace {self.namespace}.")
        return ClusterError(f"The results service of {self.where} is not reachable ({status}: "
                            f"{message}); it may be starting or failing: check `{pods}` and retry.")
