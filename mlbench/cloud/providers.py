"""The cloud providers mlbench can create clusters on, looked up by name (as SkyPilot's clouds).

Each provider module registers its :class:`~mlbench.cloud.provisioner.Provisioner` subclass with
:func:`register`; the table below only says which module defines which provider, so that looking
one up imports that provider's SDK (boto3, google-api-python-client, docker) and no other.
A new provider is one module plus one line here.
"""

from __future__ import annotations

import importlib
from typing import Any

from mlbench.cloud.provisioner import Provisioner
from mlbench.errors import UsageError

#: provider name -> the module that registers its provisioner.
PROVIDER_MODULES = {"gcloud": "mlbench.cloud.gcloud", "aws": "mlbench.cloud.aws",
                    "kind": "mlbench.cloud.kind"}
#: What `add-cluster` records: a cluster someone else made (no provisioner, only a kube context).
ADOPTED = "existing"

_REGISTERED: dict[str, type[Provisioner]] = {}


def register(cls: type[Provisioner]) -> type[Provisioner]:
    """Class decorator of a provisioner: make it the one for ``cls.provider``."""
    _REGISTERED[cls.provider] = cls
    return cls


def provisioner_class(provider: str) -> type[Provisioner]:
    if provider not in PROVIDER_MODULES:
        raise UsageError(f"Unknown provider {provider!r}; use one of {', '.join(PROVIDER_MODULES)}.")
    importlib.import_module(PROVIDER_MODULES[provider])
    return _REGISTERED[provider]


def provisioner_for(provider: str, **locator: Any) -> Provisioner:
    """The provisioner of ``provider``, set up to find clusters at ``locator`` (what its
    :meth:`~Provisioner.locator` recorded; keys it does not take are ignored)."""
    return provisioner_class(provider).from_locator(locator)
