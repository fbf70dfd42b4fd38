"""The AWS resources an EKS cluster needs besides EKS itself: IAM roles and a VPC.

Every resource is found by name or by the tag ``mlbench-cluster=<name>`` before it is created,
so each ``ensure_*`` function can run again after any failure and only adds what is missing;
each ``remove_*`` function likewise succeeds when there is nothing left to remove.

The network is one VPC with, in each of two availability zones (EKS requires two), a public
and a private subnet. Nodes live in the private subnets and have no public address: they reach
the EKS endpoint (its private endpoint is on), registries and the internet through one NAT
gateway in the first public subnet (an Elastic IP; about $0.05/hour plus $0.045 per GB it
carries, see mlbench.cloud.pricing). The public subnets hold nothing else and give no public
address by default. No security group rule admits traffic from the internet (EKS's cluster
security group only admits itself).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any
from collections.abc import Callable, Iterator

from mlbench.errors import ClusterError
from mlbench.extras import needs

TAG = "mlbench-cluster"
VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDRS = ("10.42.0.0/18", "10.42.64.0/18")            # public: the NAT gateway
PRIVATE_SUBNET_CIDRS = ("10.42.128.0/18", "10.42.192.0/18")  # private: the nodes
EKS_UNSUPPORTED_AZS = {"us-east-1e"}  # EKS control planes are not offered there
POLICY = "arn:{partition}:iam::aws:policy/{name}"
ROLES = {
    # role kind: (service that assumes it, managed policies)
    "cluster": ("eks.amazonaws.com", ["AmazonEKSClusterPolicy"]),
    "node": ("ec2.amazonaws.com", ["AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy",
                                   "AmazonEC2ContainerRegistryReadOnly"]),
}
_PERMISSION = ("AccessDenied", "UnauthorizedOperation", "AuthFailure", "NotAuthorized")
_QUOTA = ("LimitExceeded", "QuotaExceeded", "InsufficientInstanceCapacity",
          "InsufficientCapacity", "ResourceLimitExceeded")
_BAD_CREDENTIALS = ("ExpiredToken", "InvalidClientTokenId", "SignatureDoesNotMatch",
                    "UnrecognizedClientException", "InvalidAccessKeyId")


def error_code(err: Exception) -> str:
    """The AWS error code of a botocore ClientError ('' for other exceptions)."""
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def aws_error(err: Exception, doing: str) -> ClusterError:
    """One readable sentence for a failed AWS call: what happened and what to do."""
    with needs("aws"):
        from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return ClusterError("No AWS credentials found; run `aws configure`, set AWS_PROFILE, or "
                            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.")
    if not isinstance(err, ClientError):
        return ClusterError(f"Cannot reach AWS to {doing} ({err.__class__.__name__}: {err}); "
                            "check the network connection and region, then rerun the command.")
    code = error_code(err)
    message = err.response.get("Error", {}).get("Message", "")
    if any(c in code for c in _BAD_CREDENTIALS):
        return ClusterError(f"AWS rejected the credentials while trying to {doing} ({code}); "
                            "refresh them (e.g. `aws sso login` or new access keys) and rerun.")
    if any(c in code for c in _PERMISSION):
        return ClusterError(f"Permission denied while trying to {doing} ({code}: {message}); "
                            "grant your IAM identity access to EKS, EC2 and IAM roles, then rerun.")
    if any(c in code for c in _QUOTA):
        return ClusterError(f"AWS quota or capacity exceeded while trying to {doing} ({code}: "
                            f"{message}); request more quota or use fewer/smaller nodes, then "
                            "rerun.")
    return ClusterError(f"AWS could not {doing} ({code}: {message}); fix the cause and rerun "
                        "the same command to resume.")


class StillInUse(ClusterError):
    """AWS refused a deletion because something still depends on the resource (retry later)."""


@contextlib.contextmanager
def calling(doing: str) -> Iterator[None]:
    """Turn any botocore failure inside the block into :func:`aws_error`'s sentence."""
    with needs("aws"):
        from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as err:
        error = aws_error(err, doing)
        if error_code(err) == "DependencyViolation":
            raise StillInUse(str(error)) from None
        raise error from None


def tags(name: str) -> dict[str, str]:
    """The tags on everything mlbench creates for cluster ``name``."""
    return {TAG: name, "created-by": "mlbench", "Name": f"mlbench-{name}"}


def _tag_spec(resource: str, name: str, **more: str) -> list[dict[str, Any]]:
    items = {**tags(name), **more}
    return [{"ResourceType": resource, "Tags": [{"Key": k, "Value": v} for k, v in items.items()]}]


def _tagged(name: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{TAG}", "Values": [name]}]


def role_name(kind: str, name: str) -> str:
    return f"mlbench-{name}-{kind}"


def ensure_role(iam: Any, kind: str, name: str, partition: str) -> str:
    """The ARN of the cluster's ``kind`` role, created and given its policies when missing."""
    service, policies = ROLES[kind]
    role = role_name(kind, name)
    with calling(f"create IAM role {role}"):
        try:
            found = iam.get_role(RoleName=role)["Role"]
            if tags(name)[TAG] not in {t["Value"] for t in found.get("Tags", [])
                                       if t["Key"] == TAG}:
                raise ClusterError(f"The IAM role {role} exists and was not created by mlbench "
                                   f"for cluster {name}; delete or rename it, or choose another "
                                   "cluster name.")
            arn = found["Arn"]
        except iam.exceptions.NoSuchEntityException:
            trust = {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": service},
                "Action": "sts:AssumeRole"}]}
            arn = iam.create_role(
                RoleName=role, AssumeRolePolicyDocument=json.dumps(trust),
                Description=f"mlbench EKS {kind} role of cluster {name}",
                Tags=[{"Key": k, "Value": v} for k, v in tags(name).items()])["Role"]["Arn"]
        for policy in policies:
            iam.attach_role_policy(RoleName=role,
                                   PolicyArn=POLICY.format(partition=partition, name=policy))
    return arn


def remove_role(iam: Any, kind: str, name: str) -> bool:
    """Detach the policies of the cluster's ``kind`` role and delete it; False if absent."""
    role = role_name(kind, name)
    with calling(f"delete IAM role {role}"):
        try:
            attached = iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"]
        except iam.exceptions.NoSuchEntityException:
            return False
        for policy in attached:
            iam.detach_role_policy(RoleName=role, PolicyArn=policy["PolicyArn"])
        iam.delete_role(RoleName=role)
    return True


def find_vpc(ec2: Any, name: str) -> str | None:
    with calling("look up the VPC"):
        vpcs = ec2.describe_vpcs(Filters=_tagged(name))["Vpcs"]
    return vpcs[0]["VpcId"] if vpcs else None


def leftovers(ec2: Any, iam: Any, name: str) -> list[str]:
    """What of the cluster's VPC, address and IAM roles exists (to report a half-done
    create/delete)."""
    found = ["VPC"] if find_vpc(ec2, name) else []
    with calling("look up the Elastic IP"):
        if ec2.describe_addresses(Filters=_tagged(name))["Addresses"]:
            found.append("Elastic IP")
    with calling("look up the IAM roles"):
        for kind in ROLES:
            try:
                iam.get_role(RoleName=role_name(kind, name))
                found.append(f"IAM role {role_name(kind, name)}")
            except iam.exceptions.NoSuchEntityException:
                pass
    return found


def _route_table(ec2: Any, vpc: str, name: str, kind: str) -> dict[str, Any]:
    """The cluster's public or private route table (the first release's one table is public)."""
    for table in ec2.describe_route_tables(Filters=_tagged(name))["RouteTables"]:
        tags = {t["Key"]: t["Value"] for t in table.get("Tags", [])}
        if tags.get("mlbench-route", "public") == kind:
            return table
    return ec2.create_route_table(VpcId=vpc, TagSpecifications=_tag_spec(
        "route-table", name, **{"mlbench-route": kind}))["RouteTable"]


def _subnets(ec2: Any, vpc: str, name: str, table: dict[str, Any], zones: list[str],
             cidrs: tuple[str, ...], label: str) -> list[str]:
    """The subnets of one kind (``label`` "" public, "private-" private), one per zone, without
    public addresses on launch, each associated with ``table``."""
    existing = {next(t["Value"] for t in s["Tags"] if t["Key"] == "mlbench-subnet"): s
                for s in ec2.describe_subnets(Filters=_tagged(name))["Subnets"]
                if any(t["Key"] == "mlbench-subnet" for t in s.get("Tags", []))}
    associated = {a.get("SubnetId") for a in table.get("Associations", [])}
    subnets = []
    for index, cidr in enumerate(cidrs):
        subnet = existing.get(f"{label}{index}")
        if subnet is None:
            subnet = ec2.create_subnet(
                VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zones[index],
                TagSpecifications=_tag_spec("subnet", name, **{"mlbench-subnet": f"{label}{index}"})
            )["Subnet"]
        if subnet.get("MapPublicIpOnLaunch"):
            ec2.modify_subnet_attribute(SubnetId=subnet["SubnetId"], MapPublicIpOnLaunch={"Value": False})
        if subnet["SubnetId"] not in associated:
            ec2.associate_route_table(RouteTableId=table["RouteTableId"], SubnetId=subnet["SubnetId"])
        subnets.append(subnet["SubnetId"])
    return subnets


def _live_nat_gateways(ec2: Any, name: str) -> list[dict[str, Any]]:
    return ec2.describe_nat_gateways(Filters=[*_tagged(name), {
        "Name": "state", "Values": ["pending", "available", "deleting"]}])["NatGateways"]


def ensure_network(ec2: Any, name: str, progress: Callable[[str], None]) -> tuple[list[str], str]:
    """(the private subnets for the cluster and its nodes, the NAT gateway's id), creating
    whatever part of the network is missing."""
    with calling("create the VPC"):
        vpc = find_vpc(ec2, name)
        if vpc is None:
            progress(f"Creating VPC {VPC_CIDR} for {name}.")
            vpc = ec2.create_vpc(CidrBlock=VPC_CIDR,
                                 TagSpecifications=_tag_spec("vpc", name))["Vpc"]["VpcId"]
            ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsSupport={"Value": True})
            ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    with calling("create the internet gateway"):
        gateways = ec2.describe_internet_gateways(Filters=_tagged(name))["InternetGateways"]
        if gateways:
            igw = gateways[0]["InternetGatewayId"]
            attached = [a["VpcId"] for a in gateways[0].get("Attachments", [])]
        else:
            igw = ec2.create_internet_gateway(TagSpecifications=_tag_spec(
                "internet-gateway", name))["InternetGateway"]["InternetGatewayId"]
            attached = []
        if vpc not in attached:
            ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    with calling("create the public route table"):
        public = _route_table(ec2, vpc, name, "public")
        if not any(r.get("DestinationCidrBlock") == "0.0.0.0/0" for r in public.get("Routes", [])):
            ec2.create_route(RouteTableId=public["RouteTableId"],
                             DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    with calling("create the subnets"):
        zones = sorted(z["ZoneName"] for z in ec2.describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}])["AvailabilityZones"]
            if z["ZoneName"] not in EKS_UNSUPPORTED_AZS)
        if len(zones) < 2:
            raise ClusterError("EKS needs two availability zones and this region offers fewer; "
                               "choose another region with --region.")
        public_subnets = _subnets(ec2, vpc, name, public, zones, SUBNET_CIDRS, "")
    with calling("create the NAT gateway"):
        nats = _live_nat_gateways(ec2, name)
        if nats and nats[0]["State"] == "deleting":
            raise ClusterError(f"The NAT gateway of {name} is being deleted; wait for "
                               "`mlbench delete-cluster` to finish, then create it again.")
        if nats:
            nat = nats[0]["NatGatewayId"]
        else:
            progress(f"Creating a NAT gateway for the private nodes of {name}.")
            addresses = ec2.describe_addresses(Filters=_tagged(name))["Addresses"]
            allocation = (addresses[0]["AllocationId"] if addresses else ec2.allocate_address(
                Domain="vpc", TagSpecifications=_tag_spec("elastic-ip", name))["AllocationId"])
            nat = ec2.create_nat_gateway(SubnetId=public_subnets[0], AllocationId=allocation,
                                         TagSpecifications=_tag_spec("natgateway", name)
                                         )["NatGateway"]["NatGatewayId"]
    with calling("create the private route table and subnets"):
        private = _route_table(ec2, vpc, name, "private")
        if not any(r.get("DestinationCidrBlock") == "0.0.0.0/0" for r in private.get("Routes", [])):
            ec2.create_route(RouteTableId=private["RouteTableId"],
                             DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
        subnets = _subnets(ec2, vpc, name, private, zones, PRIVATE_SUBNET_CIDRS, "private-")
    return subnets, nat


def nat_gateway_state(ec2: Any, nat: str) -> str:
    with calling("read the NAT gateway"):
        found = ec2.describe_nat_gateways(NatGatewayIds=[nat])["NatGateways"]
    return found[0]["State"] if found else "missing"


def remove_network(ec2: Any, name: str) -> bool:
    """Delete the cluster's NAT gateway, its address, its VPC and everything in it; False when
    there was nothing to delete.

    Raises :class:`StillInUse` while AWS still deletes the NAT gateway or holds network
    interfaces of the deleted cluster (they are released a few minutes after it): the caller
    polls.
    """
    vpc = find_vpc(ec2, name)
    with calling("delete the NAT gateway"):
        nats = _live_nat_gateways(ec2, name)
        for nat in nats:
            if nat["State"] != "deleting":
                ec2.delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
        if nats:
            raise StillInUse("waiting for AWS to delete the NAT gateway")
        for address in ec2.describe_addresses(Filters=_tagged(name))["Addresses"]:
            try:
                ec2.release_address(AllocationId=address["AllocationId"])
            except Exception as err:
                if error_code(err) in ("InvalidIPAddress.InUse", "AuthFailure"):  # still attached
                    raise StillInUse("waiting for AWS to release the NAT gateway's address") from None
                raise
    with calling("delete the network"):
        gateways = ec2.describe_internet_gateways(Filters=_tagged(name))["InternetGateways"]
        if vpc is None and not gateways:
            return False
        if vpc is not None:
            for group in ec2.describe_security_groups(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]:
                if group["GroupName"] != "default":
                    ec2.delete_security_group(GroupId=group["GroupId"])
            for subnet in ec2.describe_subnets(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
                ec2.delete_subnet(SubnetId=subnet["SubnetId"])
            for table in ec2.describe_route_tables(
                    Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"]:
                if any(a.get("Main") for a in table.get("Associations", [])):
                    continue
                for association in table.get("Associations", []):
                    ec2.disassociate_route_table(
                        AssociationId=association["RouteTableAssociationId"])
                ec2.delete_route_table(RouteTableId=table["RouteTableId"])
        for gateway in gateways:
            for attachment in gateway.get("Attachments", []):
                ec2.detach_internet_gateway(InternetGatewayId=gateway["InternetGatewayId"],
                                            VpcId=attachment["VpcId"])
            ec2.delete_internet_gateway(InternetGatewayId=gateway["InternetGatewayId"])
        if vpc is not None:
            ec2.delete_vpc(VpcId=vpc)
    return True
