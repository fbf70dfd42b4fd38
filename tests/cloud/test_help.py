"""`create-cluster --help` says what the code does about who may reach the Kubernetes API (the
behaviour itself is checked against moto's EKS and GKE's HTTP stand-in in test_aws/test_gcloud)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.cloud import address


@pytest.mark.parametrize("provider", ["aws", "gcloud"])
def test_create_cluster_help_says_the_api_admits_this_machines_address_by_default(provider):
    result = CliRunner().invoke(cli, ["create-cluster", provider, "--help"], terminal_width=4000)
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", result.output)
    assert "Default: only this machine's public address, asked of " + address.PUBLIC_ADDRESS_URL in text
    assert "$" + address.URL_ENV in text and "when it cannot be found, nothing is created" in text
    assert "0.0.0.0/0: any address, authenticated" in text
    assert "default: any address" not in text
