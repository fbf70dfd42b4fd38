"""EKS through real boto3 over HTTP against moto's server on 127.0.0.1."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import string
import subprocess
import sys
import urllib.parse

import boto3
import pytest
import yaml
from botocore.exceptions import EndpointConnectionError
from click.testing import CliRunner

from mlbench.cli import cli
from mlbench.cli import clusters as _cluster_commands  # noqa: F401  (registers the commands)
from mlbench.cloud import aws_resources, config, manager
from mlbench.cloud.aws import AMI_NVIDIA, AMI_STANDARD, EksProvisioner
from mlbench.cloud.provisioner import ClusterSpec
from mlbench.cloud.token import EKS_TOKEN_PREFIX, eks_token
from mlbench.errors import ClusterError


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def fast(provisioner: EksProvisioner) -> EksProvisioner:
    provisioner.poll_interval = 0
    return provisioner


def tagged(client_method, key: str, name: str) -> list:
    return client_method(Filters=[{"Name": "tag:mlbench-cluster", "Values": [name]}])[key]


def aws_inventory(name: str) -> dict:
    """What exists in the (moto) account for cluster ``name``, read with plain boto3."""
    ec2, eks, iam = (boto3.client(s, region_name="us-east-1") for s in ("ec2", "eks", "iam"))
    roles = [r["RoleName"] for r in iam.list_roles()["Roles"]
             if r["RoleName"].startswith(f"mlbench-{name}-")]
    return {
        "clusters": [c for c in eks.list_clusters()["clusters"] if c == name],
        "nodegroups": (eks.list_nodegroups(clusterName=name)["nodegroups"]
                       if name in eks.list_clusters()["clusters"] else []),
        "vpcs": tagged(ec2.describe_vpcs, "Vpcs", name),
        "subnets": tagged(ec2.describe_subnets, "Subnets", name),
        "gateways": tagged(ec2.describe_internet_gateways, "InternetGateways", name),
        "route_tables": tagged(ec2.describe_route_tables, "RouteTables", name),
        "nat_gateways": [g for g in tagged(ec2.describe_nat_gateways, "NatGateways", name)
                         if g["State"] != "deleted"],
        "addresses": tagged(ec2.describe_addresses, "Addresses", name),
        "roles": sorted(roles),
    }


def test_create_list_delete_through_the_cli(moto):
    result = run("create-cluster", "aws", "4", "my-exp", "--instance-type", "m5.xlarge")
    assert result.exit_code == 0, result.output
    assert "Estimated cost: $0.94/hour" in result.output
    assert "ready with 4 nodes" in result.output

    have = aws_inventory("my-exp")
    assert have["clusters"] == ["my-exp"] and have["nodegroups"] == ["workers"]
    assert len(have["vpcs"]) == 1 and len(have["gateways"]) == 1
    assert len(have["subnets"]) == 4 and not any(s["MapPublicIpOnLaunch"] for s in have["subnets"])
    assert len({s["AvailabilityZone"] for s in have["subnets"]}) == 2
    assert len(have["nat_gateways"]) == 1 and len(have["addresses"]) == 1
    assert have["roles"] == ["mlbench-my-exp-cluster", "mlbench-my-exp-node"]
    eks = boto3.client("eks", region_name="us-east-1")
    group = eks.describe_nodegroup(clusterName="my-exp", nodegroupName="workers")["nodegroup"]
    assert group["scalingConfig"] == {"minSize": 4, "maxSize": 4, "desiredSize": 4}
    assert (group["instanceTypes"], group["amiType"], group["capacityType"]) == (
        ["m5.xlarge"], AMI_STANDARD, "ON_DEMAND")
    iam = boto3.client("iam", region_name="us-east-1")
    node_policies = {p["PolicyName"] for p in iam.list_attached_role_policies(
        RoleName="mlbench-my-exp-node")["AttachedPolicies"]}
    assert node_policies == {"AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy",
                             "AmazonEC2ContainerRegistryReadOnly"}

    record = config.current_cluster()
    assert record.key == ("aws", "my-exp") and record.nodes == 4
    kube = yaml.safe_load(record.kubeconfig.read_text())
    user = next(u["user"] for u in kube["users"] if u["name"] == record.context)
    assert user["exec"]["command"] == "mlbench"
    assert user["exec"]["args"] == ["token", "aws", "--cluster", "my-exp", "--region", "us-east-1"]

    # the kube context gets its token from mlbench (an exec plugin), not from the aws CLI
    bearer = config.kube_api_client(record).configuration.api_key["BearerToken"]
    assert bearer.startswith("Bearer " + EKS_TOKEN_PREFIX)
    assert sigv4_signature_is_valid(decode_token(bearer.split()[1]), "my-exp",
                                    "mlbench-test-secret")

    # nothing is opened to the internet, and no SSH key exists
    ec2 = boto3.client("ec2", region_name="us-east-1")
    for group in ec2.describe_security_groups(Filters=[
            {"Name": "vpc-id", "Values": [have["vpcs"][0]["VpcId"]]}])["SecurityGroups"]:
        for rule in group["IpPermissions"]:
            assert "0.0.0.0/0" not in [r["CidrIp"] for r in rule.get("IpRanges", [])]
    assert ec2.describe_key_pairs()["KeyPairs"] == []

    listed = run("list-clusters")
    assert listed.exit_code == 0
    line = next(ln for ln in listed.output.splitlines() if "my-exp" in ln)
    assert line.split()[:5] == ["*", "aws", "my-exp", "4", "ready"]

    again = run("create-cluster", "aws", "4", "my-exp")  # idempotent: nothing is duplicated
    assert again.exit_code == 0 and "resuming" in again.output
    assert aws_inventory("my-exp") == have

    deleted = run("delete-cluster", "aws", "my-exp", "--yes")
    assert deleted.exit_code == 0, deleted.output
    assert all(v == [] for v in aws_inventory("my-exp").values())
    assert config.load_clusters() == [] and config.current_cluster() is None
    assert "local" in run("list-clusters").output


def test_nodes_are_private_behind_a_nat_gateway(moto):
    """Nodes in private subnets (no public address) whose default route is a NAT gateway in a
    public subnet; the cluster's API endpoint admits only this machine's public address."""
    result = run("create-cluster", "aws", "2", "private")
    assert result.exit_code == 0, result.output
    assert ("The Kubernetes API will admit only 203.0.113.7/32, this machine's public address "
            "(--allow-api-from CIDR admits other networks).") in result.output
    eks = boto3.client("eks", region_name="us-east-1")
    vpc_config = eks.describe_cluster(name="private")["cluster"]["resourcesVpcConfig"]
    assert vpc_config["publicAccessCidrs"] == ["203.0.113.7/32"] and vpc_config["endpointPrivateAccess"]
    have = aws_inventory("private")
    kind = {s["SubnetId"]: next(t["Value"] for t in s["Tags"] if t["Key"] == "mlbench-subnet")
            for s in have["subnets"]}
    group = eks.describe_nodegroup(clusterName="private", nodegroupName="workers")["nodegroup"]
    assert sorted(kind[s] for s in group["subnets"]) == ["private-0", "private-1"]
    assert sorted(kind[s] for s in vpc_config["subnetIds"]) == ["private-0", "private-1"]
    (nat,) = have["nat_gateways"]
    assert kind[nat["SubnetId"]] == "0"  # in a public subnet
    routes = {}
    for table in have["route_tables"]:
        default = next(r for r in table["Routes"] if r.get("DestinationCidrBlock") == "0.0.0.0/0")
        for association in table.get("Associations", []):
            routes[kind[association["SubnetId"]]] = default.get("NatGatewayId") or default.get("GatewayId")
    assert routes == {"0": have["gateways"][0]["InternetGatewayId"], "1": have["gateways"][0]["InternetGatewayId"],
                      "private-0": nat["NatGatewayId"], "private-1": nat["NatGatewayId"]}
    assert run("delete-cluster", "aws", "private", "--yes").exit_code == 0
    assert all(v == [] for v in aws_inventory("private").values())


def test_the_api_admits_the_given_networks_or_asks_for_them(moto, monkeypatch):
    given = run("create-cluster", "aws", "1", "given", "--allow-api-from", "198.51.100.0/24",
                "--allow-api-from", "192.0.2.9")
    assert given.exit_code == 0, given.output
    assert "The Kubernetes API will admit only 198.51.100.0/24, 192.0.2.9/32 (--allow-api-from)." in given.output
    vpc_config = boto3.client("eks", region_name="us-east-1").describe_cluster(name="given")["cluster"][
        "resourcesVpcConfig"]
    assert vpc_config["publicAccessCidrs"] == ["198.51.100.0/24", "192.0.2.9/32"]

    bad = run("create-cluster", "aws", "1", "bad", "--allow-api-from", "everyone")
    assert bad.exit_code == 2 and "--allow-api-from everyone: give an IPv4 CIDR" in bad.output
    # offline: the address cannot be found; one line asks for the flag, nothing is created
    monkeypatch.setenv("MLBENCH_PUBLIC_ADDRESS_URL", "http://127.0.0.1:9/")
    offline = run("create-cluster", "aws", "1", "offline")
    assert offline.exit_code == 2, offline.output
    line = offline.output.strip().splitlines()[-1]
    assert line.startswith("Error: Cannot find this machine's public address") and "--allow-api-from" in line
    assert aws_inventory("offline")["vpcs"] == [] and config.find_cluster("aws", "offline") is None


def test_a_create_interrupted_half_way_is_finished_by_running_it_again(moto):
    session = boto3.Session(region_name="us-east-1")

    def network_drops(**_):
        raise EndpointConnectionError(endpoint_url="https://eks.us-east-1.amazonaws.com")

    session.events.register("before-call.eks.CreateNodegroup", network_drops)
    spec = ClusterSpec(name="resume", nodes=3, machine_type="m5.large")
    with pytest.raises(ClusterError, match="Cannot reach AWS to create the node group"):
        manager.create_cluster(fast(EksProvisioner(session=session)), spec)

    half = aws_inventory("resume")
    assert half["clusters"] == ["resume"] and half["nodegroups"] == []
    listed = run("list-clusters")
    assert "incomplete" in next(ln for ln in listed.output.splitlines() if "resume" in ln)
    assert config.current_cluster() is None

    again = run("create-cluster", "aws", "3", "resume", "--instance-type", "m5.large")
    assert again.exit_code == 0, again.output
    assert "exists (ACTIVE); resuming" in again.output
    done = aws_inventory("resume")
    assert done["nodegroups"] == ["workers"]
    assert (len(done["vpcs"]), len(done["subnets"]), len(done["gateways"]),
            len(done["route_tables"]), len(done["nat_gateways"])) == (1, 4, 1, 2, 1)
    assert config.current_cluster().key == ("aws", "resume")


def test_a_delete_interrupted_half_way_is_finished_by_running_it_again(moto):
    assert run("create-cluster", "aws", "2", "gone").exit_code == 0
    session = boto3.Session(region_name="us-east-1")

    def refused(**_):
        raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    session.events.register("before-call.ec2.DeleteVpc", refused)
    with pytest.raises(ClusterError, match="Cannot reach AWS to delete the network"):
        fast(EksProvisioner(session=session)).delete("gone", lambda *a, **k: None)
    assert "incomplete" in next(ln for ln in run("list-clusters").output.splitlines()
                                if "gone" in ln)
    result = run("delete-cluster", "aws", "gone", "--yes")
    assert result.exit_code == 0, result.output
    assert all(v == [] for v in aws_inventory("gone").values())


def test_gpu_instance_types_get_the_nvidia_ami_and_gpu_label(moto):
    session = boto3.Session(region_name="us-east-1")
    sent = {}
    session.events.register("before-call.eks.CreateNodegroup",
                            lambda params, **_: sent.update(params))
    provisioner = fast(EksProvisioner(session=session))
    provisioner.check_credentials()
    spec = ClusterSpec(name="gpus", nodes=1, machine_type="g4dn.xlarge", spot=True)
    provisioner.create(spec, lambda *a, **k: None)
    assert "remoteAccess" not in sent  # no SSH key on the nodes
    group = boto3.client("eks", region_name="us-east-1").describe_nodegroup(
        clusterName="gpus", nodegroupName="workers")["nodegroup"]
    assert (group["amiType"], group["capacityType"]) == (AMI_NVIDIA, "SPOT")
    assert group["labels"]["mlbench/gpu"] == "true"
    assert provisioner.hourly_cost(spec) == pytest.approx(0.526 + 50 * 0.08 / 730 + 0.1 + 0.045 + 0.005,
                                                           abs=1e-4)


def test_a_cluster_with_the_name_that_mlbench_did_not_create_is_left_alone(moto):
    iam = boto3.client("iam", region_name="us-east-1")
    role = iam.create_role(RoleName="theirs", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24")["Subnet"]["SubnetId"]
    boto3.client("eks", region_name="us-east-1").create_cluster(
        name="theirs", roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]})

    created = run("create-cluster", "aws", "2", "theirs")
    assert created.exit_code == 1
    assert created.output.strip().splitlines()[-1] == (
        "Error: An EKS cluster named theirs already exists in us-east-1 and was not created by "
        "mlbench; choose another name, or adopt it with `mlbench add-cluster NAME --context "
        "CTX`.")
    assert aws_inventory("theirs")["vpcs"] == []
    deleted = run("delete-cluster", "aws", "theirs", "--yes", "--region", "us-east-1")
    assert deleted.exit_code == 1 and "not created by mlbench" in deleted.output
    assert boto3.client("eks", region_name="us-east-1").list_clusters()["clusters"] == ["theirs"]


def test_missing_credentials_are_one_line(monkeypatch):
    result = run("create-cluster", "aws", "2", "nocreds")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: No AWS credentials found; run `aws configure`, set AWS_PROFILE, or set "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.")
    assert config.load_clusters() == []


def test_an_unknown_profile_is_a_usage_error():
    result = run("create-cluster", "aws", "2", "x", "--profile", "nope")
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: The AWS profile 'nope' does not exist; check "
                                     "~/.aws/config or pass another --profile.")


def test_an_unknown_instance_type_is_a_usage_error(moto):
    result = run("create-cluster", "aws", "2", "typo", "--instance-type", "m5.huuuge")
    assert result.exit_code == 2
    assert "instance type 'm5.huuuge' does not exist in us-east-1" in result.output
    assert config.load_clusters() == []  # refused before anything was recorded


def test_quota_and_permission_errors_say_what_to_do():
    from botocore.exceptions import ClientError

    def client_error(code: str, message: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": message}}, "CreateNodegroup")

    quota = aws_resources.aws_error(client_error("ResourceLimitExceeded", "vCPU limit 16"),
                                    "create the node group")
    assert "quota or capacity exceeded" in str(quota) and "request more quota" in str(quota)
    denied = aws_resources.aws_error(client_error("AccessDeniedException", "not allowed"),
                                     "create the node group")
    assert "Permission denied" in str(denied) and "grant your IAM identity" in str(denied)


def decode_token(token: str) -> str:
    encoded = token[len(EKS_TOKEN_PREFIX):]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()


def sigv4_signature_is_valid(url: str, cluster: str, secret: str) -> bool:
    """Check a presigned GET the way STS does (SigV4 written out, independent of botocore)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    fields = dict(query)
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(query) if k != "X-Amz-Signature")
    canonical = "\n".join(["GET", parts.path or "/", canonical_query, f"host:{parts.netloc}",
                           f"x-k8s-aws-id:{cluster}", "", fields["X-Amz-SignedHeaders"],
                           hashlib.sha256(b"").hexdigest()])
    scope = fields["X-Amz-Credential"].split("/", 1)[1]
    to_sign = "\n".join(["AWS4-HMAC-SHA256", fields["X-Amz-Date"], scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["X-Amz-Signature"])


def test_the_eks_token_has_the_documented_format(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAMLBENCHTEST00002")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "mlbench-test-secret")
    token, expires = eks_token(boto3.Session(), "my-exp", "eu-west-1")  # signing is local
    assert token.startswith(EKS_TOKEN_PREFIX) and "=" not in token
    assert set(token[len(EKS_TOKEN_PREFIX):]) <= set(string.ascii_letters + string.digits + "-_")
    url = decode_token(token)
    assert urllib.parse.urlsplit(url).netloc == "sts.eu-west-1.amazonaws.com"
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["Action"] == ["GetCallerIdentity"] and query["Version"] == ["2011-06-15"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]
    assert query["X-Amz-Credential"][0].startswith("AKIAMLBENCHTEST00002/")
    assert query["X-Amz-Credential"][0].endswith("/eu-west-1/sts/aws4_request")
    assert sigv4_signature_is_valid(url, "my-exp", "mlbench-test-secret")
    assert not sigv4_signature_is_valid(url, "other-cluster", "mlbench-test-secret")
    lifetime = expires - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(minutes=13) < lifetime <= datetime.timedelta(minutes=14)


def test_the_kube_context_runs_the_mlbench_on_path_not_the_interpreter_that_made_it(moto, tmp_path,
                                                                                   monkeypatch):
    assert run("create-cluster", "aws", "1", "moved").exit_code == 0
    record = config.current_cluster()
    text = record.kubeconfig.read_text()
    assert sys.executable not in text and "python" not in text
    user = next(u["user"] for u in yaml.safe_load(text)["users"] if u["name"] == record.context)["exec"]
    # the virtual environment that made the cluster is gone; mlbench is installed elsewhere
    bin_dir = tmp_path / "another-venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mlbench").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mlbench "$@"\n')
    (bin_dir / "mlbench").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    plugin = subprocess.run([user["command"], *user["args"]], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **{e["name"]: e["value"] for e in user.get("env", [])}})
    assert plugin.returncode == 0, plugin.stderr
    credential = json.loads(plugin.stdout)
    assert credential["kind"] == "ExecCredential"
    assert sigv4_signature_is_valid(decode_token(credential["status"]["token"]), "moved",
                                    "mlbench-test-secret")


def test_the_exec_plugin_prints_an_exec_credential(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAMLBENCHTEST00003")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "plugin-secret")
    plugin = subprocess.run([sys.executable, "-m", "mlbench.cloud.token", "aws", "--cluster",
                             "ctx", "--region", "us-east-1"], capture_output=True, text=True,
                            timeout=60)
    credential = json.loads(plugin.stdout)
    assert (credential["apiVersion"], credential["kind"]) == (
        "client.authentication.k8s.io/v1beta1", "ExecCredential")
    assert sigv4_signature_is_valid(decode_token(credential["status"]["token"]), "ctx",
                                    "plugin-secret")
    assert credential["status"]["expirationTimestamp"].endswith("Z")
