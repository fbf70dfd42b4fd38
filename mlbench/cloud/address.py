"""Who may reach the Kubernetes API of a cluster mlbench creates.

GKE and EKS make a cluster's API endpoint public (authenticated) unless told otherwise. mlbench
narrows it: to the CIDRs of ``--allow-api-from`` when given, else to this machine's public IPv4
address, asked of ``https://checkip.amazonaws.com`` (AWS's documented what-is-my-IP endpoint,
which answers the caller's address as plain text; ``$MLBENCH_PUBLIC_ADDRESS_URL`` names another
service that answers the same way). When the address cannot be found (no network, a proxy that
hides it), creating the cluster stops with one line that asks for ``--allow-api-from``;
``--allow-api-from 0.0.0.0/0`` keeps the API open to any address, as the clouds' default.
"""

from __future__ import annotations

import ipaddress
import os

from mlbench.errors import UsageError

PUBLIC_ADDRESS_URL = "https://checkip.amazonaws.com"
URL_ENV = "MLBENCH_PUBLIC_ADDRESS_URL"
TIMEOUT_SECONDS = 10.0


def public_address() -> str:
    """This machine's public IPv4 address, as the address service sees it."""
    import urllib.request  # here: the CLI imports this module for its --help, which asks nothing

    url = os.environ.get(URL_ENV) or PUBLIC_ADDRESS_URL
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            text = response.read(100).decode("ascii", "replace").strip()
        return str(ipaddress.IPv4Address(text))
    except (OSError, ValueError) as err:
        raise UsageError(
            f"Cannot find this machine's public address at {url} ({type(err).__name__}: {err}) to "
            "restrict the cluster's Kubernetes API to it; pass --allow-api-from CIDR (your network, "
            "repeatable), or --allow-api-from 0.0.0.0/0 to leave the API open to any address."
        ) from None


def api_cidrs(given: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """(the IPv4 CIDRs the API admits, whether they are this machine's address found here)."""
    if not given:
        return (f"{public_address()}/32",), True
    cidrs = []
    for text in given:
        try:
            cidrs.append(str(ipaddress.IPv4Network(text.strip(), strict=False)))
        except ValueError:
            raise UsageError(f"--allow-api-from {text}: give an IPv4 CIDR such as 203.0.113.0/24 "
                             "or one address such as 203.0.113.7") from None
    return tuple(cidrs), False


def describe(cidrs: tuple[str, ...], found_here: bool) -> str:
    """The line create-cluster prints about who may reach the API."""
    listed = ", ".join(cidrs)
    if found_here:
        return (f"The Kubernetes API will admit only {listed}, this machine's public address "
                "(--allow-api-from CIDR admits other networks).")
    if "0.0.0.0/0" in cidrs:
        return "The Kubernetes API will admit any address (--allow-api-from 0.0.0.0/0), authenticated."
    return f"The Kubernetes API will admit only {listed} (--allow-api-from)."
