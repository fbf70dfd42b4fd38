"""The table of distributed optimizers by name, filled by the :func:`register` decorator.

Each optimizer module decorates its classes with ``@register``; :mod:`mlbench.optim.catalog`
imports every module (which fills the table) and answers lookups. Keeping the table here, apart
from both, is what lets an optimizer module import the base classes without a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlbench.optim.base import DistributedOptimizer

OPTIMIZERS: dict[str, type[DistributedOptimizer]] = {}


def register(cls: type[DistributedOptimizer]) -> type[DistributedOptimizer]:
    """Class decorator: make ``cls`` available as ``--optimizer cls.info.name``."""
    OPTIMIZERS[cls.info.name] = cls
    return cls
