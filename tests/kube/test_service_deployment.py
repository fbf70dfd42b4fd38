"""The results service as deployed on a cluster: private, least-privileged, token-protected,
reached through the API server with the user's credentials."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from mlbench.launch import kubernetes
from tests.kube.conftest import mlbench_cli

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


def allowed(api, namespace: str, verb: str, resource: str, *, group: str = "", ns: str | None = None) -> bool:
    """What the API server's RBAC lets the service's account do (a SubjectAccessReview)."""
    review = client.AuthorizationV1Api(api).create_subject_access_review({"spec": {
        "user": f"system:serviceaccount:{namespace}:mlbench-results",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
        "resourceAttributes": {"namespace": ns or namespace, "verb": verb, "resource": resource, "group": group}}})
    return review.status.allowed


def get(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"X-Mlbench-Token": token} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_results_service_is_private_least_privileged_and_token_protected(cluster, monkeypatch):
    store = kubernetes.open_store(cluster.record)
    assert store.client is None and store.list() == []      # nothing deployed yet: no runs
    kubernetes.ensure_service(store, "mlbench/worker:test", progress=lambda message: None)
    core, ns = cluster.core, cluster.namespace

    service = cluster.api.sanitize_for_serialization(core.read_namespaced_service("mlbench-results", ns))
    assert service["spec"]["type"] == "ClusterIP" and "externalIPs" not in service["spec"]
    assert all("nodePort" not in port for port in service["spec"]["ports"])
    # the service account may end runs and remove their objects, and nothing else
    for verb, resource in (("list", "pods"), ("delete", "pods"), ("delete", "services"), ("delete", "configmaps")):
        assert allowed(cluster.api, ns, verb, resource), (verb, resource)
    for verb, resource in (("create", "pods"), ("get", "secrets"), ("list", "secrets"), ("create", "configmaps"),
                           ("delete", "persistentvolumeclaims"), ("patch", "pods"), ("create", "pods/exec")):
        assert not allowed(cluster.api, ns, verb, resource), (verb, resource)
    assert not allowed(cluster.api, ns, "delete", "deployments", group="apps")
    assert not allowed(cluster.api, ns, "list", "pods", ns="default")         # its namespace only
    assert not core.read_namespaced_service_account("mlbench-results", ns).automount_service_account_token

    secret = core.read_namespaced_secret("mlbench-results", ns)
    tokens = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    assert set(tokens) == {"worker-token", "admin-token"}
    assert tokens["worker-token"] != tokens["admin-token"] and min(map(len, tokens.values())) >= 40

    url = os.environ["MLBENCH_RESULTS_URL"]
    assert get(f"{url}/healthz", None) == 200
    assert get(f"{url}/v1/runs", None) == 401
    assert get(f"{url}/v1/runs", tokens["worker-token"]) == 403
    assert get(f"{url}/v1/runs", tokens["admin-token"]) == 200

    # deploying again (every `mlbench run` checks) keeps the service and its tokens
    deployment = client.AppsV1Api(cluster.api).read_namespaced_deployment("mlbench-results", ns)
    kubernetes.ensure_service(store, "mlbench/worker:test", progress=lambda message: None)
    assert client.AppsV1Api(cluster.api).read_namespaced_deployment(
        "mlbench-results", ns).metadata.uid == deployment.metadata.uid
    assert core.read_namespaced_secret("mlbench-results", ns).data == secret.data


def test_the_cli_reaches_the_service_through_the_api_servers_proxy(cluster, monkeypatch):
    store = kubernetes.open_store(cluster.record)
    kubernetes.ensure_service(store, "mlbench/worker:test", progress=lambda message: None)
    monkeypatch.delenv("MLBENCH_RESULTS_URL")
    # The API server answers for the service (with the user's credentials), but cannot forward to
    # a pod on a loopback address, which is all the harness has: one readable line, no traceback.
    result = mlbench_cli("status")
    assert result.exit_code == 1
    line = result.output.strip()
    assert line.startswith(f"Error: The results service of cluster harness (namespace {cluster.namespace}) "
                           "is not reachable (")
    assert f"kubectl -n {cluster.namespace} get pods -l app.kubernetes.io/name=mlbench-results" in line
    assert "\n" not in line and "Traceback" not in result.output
