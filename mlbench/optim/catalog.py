"""Imports every optimizer module so that each registers itself (see base.register)."""

from mlbench.optim import centralized  # noqa: F401
