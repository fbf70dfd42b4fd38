"""Short-lived Kubernetes bearer tokens for GKE and EKS, as a kubeconfig exec plugin.

mlbench's kubeconfig runs ``mlbench token aws|gcloud ...`` whenever a client (mlbench itself
through the kubernetes package, or kubectl) needs a token, so neither the `aws` nor the `gcloud`
CLI is needed and no long-lived secret is written to disk. The command is the ``mlbench`` on
PATH when the token is needed, not the interpreter that wrote the kubeconfig, so the contexts
keep working after that virtual environment is removed or mlbench is installed elsewhere
(``mlbench token`` starts without loading the rest of the CLI).

- EKS: the token is ``k8s-aws-v1.`` + unpadded base64url of an STS ``GetCallerIdentity`` URL
  presigned with SigV4 for 60 seconds, whose signed headers include ``x-k8s-aws-id: <cluster>``
  (the format of aws-iam-authenticator and `aws eks get-token`). EKS accepts it for 15 minutes.
- GKE: an OAuth2 access token of google-auth's application default credentials.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import sys
from typing import Any

from mlbench.extras import needs

EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"
EKS_TOKEN_PREFIX = "k8s-aws-v1."
EKS_CLUSTER_HEADER = "x-k8s-aws-id"
EKS_PRESIGN_SECONDS = 60
EKS_TOKEN_LIFETIME = dt.timedelta(minutes=14)  # EKS honours 15; refresh a minute early
GOOGLE_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def eks_token(session: Any, cluster: str, region: str) -> tuple[str, dt.datetime]:
    """A bearer token for the EKS cluster ``cluster``, signed with ``session``'s credentials."""
    sts = session.client("sts", region_name=region)

    def add_cluster_header(request: Any, **_: Any) -> None:
        request.headers[EKS_CLUSTER_HEADER] = cluster

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    url = sts.generate_presigned_url("get_caller_identity", Params={},
                                     ExpiresIn=EKS_PRESIGN_SECONDS, HttpMethod="GET")
    encoded = base64.urlsafe_b64encode(url.encode("utf-8")).decode("ascii").rstrip("=")
    expires = dt.datetime.now(dt.timezone.utc) + EKS_TOKEN_LIFETIME
    return EKS_TOKEN_PREFIX + encoded, expires


def gcloud_token() -> tuple[str, dt.datetime | None]:
    """An access token of the application default credentials (refreshed now)."""
    with needs("gcp"):
        import google.auth
        import google.auth.transport.requests

    credentials, _ = google.auth.default(scopes=GOOGLE_SCOPES)
    credentials.refresh(google.auth.transport.requests.Request())
    expiry = credentials.expiry
    if expiry is not None and expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=dt.timezone.utc)
    return credentials.token, expiry


def exec_credential(token: str, expires: dt.datetime | None) -> dict[str, Any]:
    """The ExecCredential object a kubeconfig exec plugin prints."""
    status: dict[str, Any] = {"token": token}
    if expires is not None:
        status["expirationTimestamp"] = expires.astimezone(dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": EXEC_API_VERSION, "kind": "ExecCredential", "spec": {},
            "status": status}


def exec_user(provider: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """The kubeconfig ``user`` entry that runs ``mlbench token`` for ``provider``."""
    user: dict[str, Any] = {
        "apiVersion": EXEC_API_VERSION,
        "command": "mlbench",
        "args": ["token", provider, *args],
        "interactiveMode": "Never",
        "provideClusterInfo": False,
    }
    if env:
        user["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    return {"exec": user}


def main(argv: list[str] | None = None) -> int:
    """Print an ExecCredential for the provider named on the command line."""
    parser = argparse.ArgumentParser(prog="mlbench token")
    sub = parser.add_subparsers(dest="provider", required=True)
    aws = sub.add_parser("aws", help="EKS token from boto3's credential chain")
    aws.add_argument("--cluster", required=True)
    aws.add_argument("--region", required=True)
    aws.add_argument("--profile")
    sub.add_parser("gcloud", help="GKE token from google-auth application default credentials")
    args = parser.parse_args(argv)
    expires: dt.datetime | None  # an EKS token's end; Google's may have none
    try:
        if args.provider == "aws":
            with needs("aws"):
                import boto3

            session = boto3.Session(profile_name=args.profile, region_name=args.region)
            if session.get_credentials() is None:
                raise RuntimeError("no AWS credentials found; run `aws configure` or set "
                                   "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
            token, expires = eks_token(session, args.cluster, args.region)
        else:
            token, expires = gcloud_token()
    except Exception as err:  # an exec plugin reports any failure as one line on stderr
        print(f"mlbench token ({args.provider}): {err}", file=sys.stderr)
        return 1
    json.dump(exec_credential(token, expires), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
