"""mlbench's version, in a module of its own: the lowest layers (the data downloader's user
agent, the worker image's tag, a Slurm script's header, a run's environment) need it without
importing the package's front door (``mlbench/__init__.py``), which stands above every layer."""

__version__ = "0.1.0"
