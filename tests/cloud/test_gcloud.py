"""GKE through google-api-python-client's own test transport (HttpMockSequence) and the static
`container` v1 discovery document shipped in the package; every request body is checked
against that document's schema."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import googleapiclient
import pytest
import yaml
from click.testing import CliRunner
from googleapiclient.http import HttpMockSequence

from mlbench.cli import cli
from mlbench.cli import clusters as _cluster_commands  # noqa: F401  (registers the commands)
from mlbench.cloud import config, manager
from mlbench.cloud.gcloud import GkeProvisioner
from mlbench.cloud.provisioner import ClusterSpec
from mlbench.errors import ClusterError

DOC = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                  / "container.v1.json").read_text())
METHODS = DOC["resources"]["projects"]["resources"]["locations"]["resources"]
PARENT = "projects/proj/locations/us-central1-a"
OK = {"status": "200"}


def schema_errors(value, schema: dict, path: str = "$") -> list[str]:
    """Where ``value`` breaks the discovery schema (unknown, read-only, deprecated, wrong type)."""
    if "$ref" in schema:
        schema = DOC["schemas"][schema["$ref"]]
    errors = []
    if schema.get("readOnly"):
        errors.append(f"{path} is output only")
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return errors + [f"{path} is not an object"]
        properties = schema.get("properties")
        for key, item in value.items():
            if properties is not None:
                if key not in properties:
                    errors.append(f"{path}.{key} is not a field")
                    continue
                if properties[key].get("deprecated"):
                    errors.append(f"{path}.{key} is deprecated")
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{key}")
    elif kind == "array":
        if not isinstance(value, list):
            return errors + [f"{path} is not an array"]
        for index, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{index}]")
    elif kind == "string":
        if not isinstance(value, str):
            errors.append(f"{path} is not a string")
        elif schema.get("format") in ("int64", "uint64") and not value.lstrip("-").isdigit():
            errors.append(f"{path} is not an int64 string")
        elif "enum" in schema and value not in schema["enum"]:
            errors.append(f"{path}={value} is not one of {schema['enum']}")
    elif kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
        errors.append(f"{path} is not an integer")
    elif kind == "boolean" and not isinstance(value, bool):
        errors.append(f"{path} is not a boolean")
    return errors


def bodies(http: HttpMockSequence, method: str) -> list[dict]:
    return [json.loads(body) for _, verb, body, _ in http.request_sequence
            if verb == method and body]


def reply(payload: dict, status: int = 200) -> tuple[dict, str]:
    return {"status": str(status)}, json.dumps(payload)


def error(status: int, message: str, reason: str) -> tuple[dict, str]:
    return reply({"error": {"code": status, "message": message, "status": reason}}, status)


def operation(op_id: str, status: str, op_type: str = "CREATE_CLUSTER", **more) -> dict:
    return {"name": op_id, "status": status, "operationType": op_type, "zone": "us-central1-a",
            "targetLink": f"https://container.googleapis.com/v1/{PARENT}/clusters/my-exp",
            **more}


def cluster(status: str, nodes: int = 4, ours: bool = True) -> dict:
    return {"name": "my-exp", "status": status, "endpoint": "203.0.113.7",
            "masterAuth": {"clusterCaCertificate": "LS0tLS1CRUdJTi1DQS0tLS0t"},
            "resourceLabels": {"created-by": "mlbench"} if ours else {},
            "nodePools": [{"name": "workers", "initialNodeCount": nodes}]}


def gke(responses: list, **kw) -> tuple[GkeProvisioner, HttpMockSequence]:
    http = HttpMockSequence(responses)
    provisioner = GkeProvisioner(project="proj", http=http, **kw)
    provisioner.poll_interval, provisioner.num_retries = 0, 0
    return provisioner, http


def missing() -> tuple[dict, str]:
    return error(404, f"Not found: {PARENT}/clusters/my-exp.", "NOT_FOUND")


def test_create_sends_a_valid_request_polls_the_operation_and_writes_a_context():
    provisioner, http = gke([
        missing(),
        reply(operation("operation-1", "RUNNING")),
        reply(operation("operation-1", "RUNNING", progress={"stages": [
            {"name": "Creating control plane", "status": "RUNNING"}]})),
        reply(operation("operation-1", "RUNNING", progress={"metrics": [
            {"name": "nodes done", "intValue": "3"}, {"name": "nodes total", "intValue": "4"}]})),
        reply(operation("operation-1", "DONE")),
        reply(cluster("RUNNING")), reply(cluster("RUNNING")), reply(cluster("RUNNING")),
    ])
    seen = []
    spec = ClusterSpec(name="my-exp", nodes=4, machine_type="n1-standard-4",
                       gpu_type="nvidia-tesla-t4", gpus_per_node=1, spot=True,
                       kubernetes_version="1.31", api_cidrs=("198.51.100.0/24",),
                       shared_storage_class="standard-rwx")
    record = manager.create_cluster(provisioner, spec, lambda m, transient=False: seen.append(m))

    (body,) = bodies(http, "POST")
    assert schema_errors(body, METHODS["clusters"]["methods"]["create"]["request"]) == []
    pool = body["cluster"]["nodePools"][0]
    assert (pool["initialNodeCount"], pool["config"]["machineType"], pool["config"]["spot"]) == (
        4, "n1-standard-4", True)
    assert pool["config"]["accelerators"] == [{
        "acceleratorCount": "1", "acceleratorType": "nvidia-tesla-t4",
        "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"}}]
    assert body["cluster"]["resourceLabels"] == {"created-by": "mlbench"}
    assert body["cluster"]["initialClusterVersion"] == "1.31"
    # a shared storage class for the results service's volume: GKE's ReadWriteMany classes are
    # the Filestore CSI driver's, which the cluster gets, and the record keeps the class
    assert body["cluster"]["addonsConfig"] == {"gcpFilestoreCsiDriverConfig": {"enabled": True}}
    assert record.shared_storage_class == "standard-rwx"
    assert body["parent"] == PARENT
    uris = [uri for uri, *_ in http.request_sequence]
    assert sum(uri.endswith(f"{PARENT}/operations/operation-1?alt=json") for uri in uris) == 3
    polls = [m for m in seen if m.startswith("creating GKE cluster my-exp")]
    assert [p.split(" (")[0] for p in polls] == [
        "creating GKE cluster my-exp: RUNNING, Creating control plane",
        "creating GKE cluster my-exp: RUNNING, 3/4 nodes", "creating GKE cluster my-exp: DONE"]

    kube = yaml.safe_load(record.kubeconfig.read_text())
    entry = next(c["cluster"] for c in kube["clusters"] if c["name"] == record.context)
    assert entry == {"server": "https://203.0.113.7",
                     "certificate-authority-data": "LS0tLS1CRUdJTi1DQS0tLS0t"}
    user = next(u["user"] for u in kube["users"] if u["name"] == record.context)
    assert (user["exec"]["command"], user["exec"]["args"]) == ("mlbench", ["token", "gcloud"])
    assert config.current_cluster().key == ("gcloud", "my-exp")
    assert record.extra["project"] == "proj" and record.extra["zone"] == "us-central1-a"


def test_by_default_the_api_admits_only_this_machines_public_address():
    provisioner, http = gke([missing(), reply(operation("operation-1", "RUNNING")),
                             reply(operation("operation-1", "DONE")), reply(cluster("RUNNING")),
                             reply(cluster("RUNNING")), reply(cluster("RUNNING"))])
    seen = []
    manager.create_cluster(provisioner, ClusterSpec(name="my-exp", nodes=4),
                           lambda m, transient=False: seen.append(m))
    (body,) = bodies(http, "POST")
    assert schema_errors(body, METHODS["clusters"]["methods"]["create"]["request"]) == []
    assert body["cluster"]["controlPlaneEndpointsConfig"] == {"ipEndpointsConfig": {"authorizedNetworksConfig": {
        "enabled": True, "cidrBlocks": [{"cidrBlock": "203.0.113.7/32", "displayName": "mlbench"}]}}}
    assert ("The Kubernetes API will admit only 203.0.113.7/32, this machine's public address "
            "(--allow-api-from CIDR admits other networks).") in seen
    assert config.current_cluster().extra["spec"]["api_cidrs"] == ["203.0.113.7/32"]


def test_the_default_request_is_valid_and_opens_nothing():
    provisioner, _ = gke([])
    body = provisioner.cluster_body(ClusterSpec(name="plain", nodes=2))
    assert schema_errors(body, {"$ref": "CreateClusterRequest"}) == []
    assert "controlPlaneEndpointsConfig" not in body["cluster"] and "addonsConfig" not in body["cluster"]
    assert body["cluster"]["masterAuth"]["clientCertificateConfig"] == {
        "issueClientCertificate": False}
    assert "accelerators" not in body["cluster"]["nodePools"][0]["config"]
    assert provisioner.hourly_cost(ClusterSpec(name="plain", nodes=4)) == pytest.approx(
        4 * (0.19 + 50 * 0.04 / 730) + 0.10, abs=1e-4)


def test_an_interrupted_create_resumes_by_following_the_pending_operation():
    provisioner, http = gke([
        reply(cluster("PROVISIONING")),
        reply({"operations": [operation("operation-old", "DONE", "UPGRADE_MASTER"),
                              operation("operation-7", "RUNNING")]}),
        reply(operation("operation-7", "DONE")),
        reply(cluster("RUNNING")), reply(cluster("RUNNING")), reply(cluster("RUNNING")),
    ])
    config.save_cluster(config.ClusterRecord(   # what the interrupted create had recorded
        provider="gcloud", name="my-exp", context=config.context_name("gcloud", "my-exp"),
        kubeconfig=config.kubeconfig_path(), nodes=4, extra={config.SHARED_STORAGE_KEY: "standard-rwx"}))
    record = manager.create_cluster(provisioner, ClusterSpec(name="my-exp", nodes=4))
    assert bodies(http, "POST") == []  # nothing created twice
    assert record.shared_storage_class == "standard-rwx"   # kept from the first time, not asked again
    assert http.request_sequence[2][0].endswith(f"{PARENT}/operations/operation-7?alt=json")
    assert record.context in record.kubeconfig.read_text()


def test_a_failed_operation_is_one_sentence_and_the_cluster_is_listed_as_it_is():
    quota = "Insufficient regional quota to satisfy request: resource \"CPUS\""
    provisioner, _ = gke([missing(), reply(operation("operation-2", "RUNNING")),
                          reply(operation("operation-2", "DONE", error={"code": 8,
                                                                        "message": quota}))])
    with pytest.raises(ClusterError) as caught:
        manager.create_cluster(provisioner, ClusterSpec(name="my-exp", nodes=40, shared_storage_class="standard-rwx"))
    assert str(caught.value) == ("GKE could not finish: creating GKE cluster my-exp (" + quota
                                 + "); fix the cause and rerun the same command.")
    assert config.find_cluster("gcloud", "my-exp").shared_storage_class == "standard-rwx"
    assert config.current_cluster() is None
    provisioner, _ = gke([reply({**cluster("ERROR"), "conditions": [{"message": quota}]})])
    status = provisioner.query("my-exp")
    assert (status.state, status.detail) == ("error", quota)


@pytest.mark.parametrize("response, expected", [
    (error(403, "Kubernetes Engine API has not been used in project proj before or it is "
                "disabled.", "PERMISSION_DENIED"),
     "The Kubernetes Engine API is not enabled in project proj; enable container.googleapis.com "
     "in the Cloud Console and rerun."),
    (error(429, "Quota exceeded for quota metric 'Requests'.", "RESOURCE_EXHAUSTED"),
     "Google Cloud quota exceeded while trying to create cluster my-exp (Quota exceeded for "
     "quota metric 'Requests'.); request more quota, or use fewer or smaller nodes, and rerun."),
    (error(403, "Required 'container.clusters.create' permission.", "PERMISSION_DENIED"),
     "Permission denied while trying to create cluster my-exp in project proj (Required "
     "'container.clusters.create' permission.); grant your account roles/container.admin and "
     "rerun."),
    (error(401, "Request had invalid authentication credentials.", "UNAUTHENTICATED"),
     "Google Cloud rejected the credentials while trying to create cluster my-exp (Request had "
     "invalid authentication credentials.); run `gcloud auth application-default login` again."),
])
def test_api_errors_are_one_sentence_saying_what_to_do(response, expected):
    provisioner, _ = gke([missing(), response])
    with pytest.raises(ClusterError) as caught:
        provisioner.create(ClusterSpec(name="my-exp", nodes=4), lambda *a, **k: None)
    assert str(caught.value) == expected


def test_a_cluster_mlbench_did_not_create_is_neither_reused_nor_deleted():
    provisioner, http = gke([reply(cluster("RUNNING", ours=False))] * 2)
    with pytest.raises(ClusterError, match="was not created by mlbench"):
        provisioner.create(ClusterSpec(name="my-exp", nodes=4), lambda *a, **k: None)
    with pytest.raises(ClusterError, match="was not created by mlbench"):
        provisioner.delete("my-exp", lambda *a, **k: None)
    assert [verb for _, verb, *_ in http.request_sequence] == ["GET", "GET"]


def test_delete_follows_the_operation_and_succeeds_when_already_gone():
    provisioner, http = gke([
        reply(cluster("RUNNING")), reply({"operations": []}),
        reply(operation("operation-9", "RUNNING", "DELETE_CLUSTER")),
        reply(operation("operation-9", "DONE", "DELETE_CLUSTER")), missing()])
    provisioner.delete("my-exp", lambda *a, **k: None)
    assert [verb for _, verb, *_ in http.request_sequence][:4] == ["GET", "GET", "DELETE", "GET"]
    provisioner.delete("my-exp", lambda *a, **k: None)  # the 404: nothing left to do


@pytest.fixture
def adc(tmp_path, monkeypatch):
    """Application default credentials whose token endpoint is a server on 127.0.0.1."""
    class TokenHandler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            payload = json.dumps({"access_token": "ya29.mlbench-test", "expires_in": 3600,
                                  "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), TokenHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
    path = tmp_path / "adc.json"
    path.write_text(json.dumps({  # a service-account key: google-auth honours its token_uri
        "type": "service_account", "project_id": "proj", "private_key_id": "test-key",
        "private_key": key, "client_email": "mlbench-test@proj.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": f"http://127.0.0.1:{server.server_port}/token"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    yield path
    server.shutdown()


def test_the_cli_creates_lists_and_deletes_with_default_credentials(adc, monkeypatch):
    http = HttpMockSequence([
        missing(), reply(operation("operation-1", "RUNNING")), reply(operation("operation-1",
                                                                              "DONE")),
        reply(cluster("RUNNING")), reply(cluster("RUNNING")), reply(cluster("RUNNING")),
        reply(cluster("RUNNING")),  # list-clusters
        reply(cluster("RUNNING")), reply({"operations": []}),
        reply(operation("operation-2", "DONE", "DELETE_CLUSTER")),
        reply(operation("operation-2", "DONE", "DELETE_CLUSTER")),
    ])
    monkeypatch.setattr("mlbench.cloud.gcloud._authorized_http", lambda credentials: http)
    monkeypatch.setattr(GkeProvisioner, "poll_interval", 0)
    runner = CliRunner()
    created = runner.invoke(cli, ["create-cluster", "gcloud", "4", "my-exp", "--machine-type",
                                  "n1-standard-4", "--gpu-type", "nvidia-tesla-t4",
                                  "--num-gpus", "1"], catch_exceptions=False)
    assert created.exit_code == 0, created.output
    assert "Estimated cost: $2.27/hour" in created.output
    (body,) = bodies(http, "POST")
    assert schema_errors(body, {"$ref": "CreateClusterRequest"}) == []
    listed = runner.invoke(cli, ["list-clusters"])
    assert next(ln for ln in listed.output.splitlines() if "my-exp" in ln).split()[:6] == [
        "*", "gcloud", "my-exp", "4", "ready", "proj/us-central1-a"]
    deleted = runner.invoke(cli, ["delete-cluster", "gcloud", "my-exp", "--yes"])
    assert deleted.exit_code == 0, deleted.output
    assert config.load_clusters() == []


def test_the_exec_plugin_prints_a_token_of_the_default_credentials(adc):
    plugin = subprocess.run([sys.executable, "-m", "mlbench.cloud.token", "gcloud"],
                            capture_output=True, text=True, timeout=60)
    assert plugin.returncode == 0, plugin.stderr
    credential = json.loads(plugin.stdout)
    assert credential["status"]["token"] == "ya29.mlbench-test"
    assert credential["status"]["expirationTimestamp"].endswith("Z")


def test_missing_credentials_are_one_line():
    result = CliRunner().invoke(cli, ["create-cluster", "gcloud", "2", "nocreds"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: No Google Cloud credentials found; run `gcloud auth application-default login` "
        "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file.")
