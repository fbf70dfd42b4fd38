"""mlbench: benchmarks for distributed machine-learning training."""

__version__ = "0.1.0"
