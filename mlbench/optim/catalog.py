"""Imports every optimizer module so that each registers itself (see base.register).

:data:`ORDER` is the order in which ``mlbench optimizers`` and the README list them: the
reference first, then the other all-reduce methods, then the compressing and decentralized
ones, then the plain-PyTorch baseline.
"""

from mlbench.optim import centralized, ddp, decentralized, powersgd, signsgd, sparsified  # noqa: F401

ORDER = ("centralized-sgd", "centralized-adam", "model-averaging", "powersgd", "signsgd",
         "sparsified-sgd", "decentralized-sgd", "ddp")
