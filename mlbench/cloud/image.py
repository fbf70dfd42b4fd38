"""The mlbench worker image: ``docker/Dockerfile``, built through the docker SDK.

The tag is the package version (``mlbench/worker:<version>``, ``-cuda`` for the CUDA variant),
so a cluster runs exactly the code of the CLI that launched it. The CPU and CUDA variants are the
same Dockerfile with another PyTorch wheel index: CUDA wheels bundle the CUDA runtime, and the
node supplies the driver. A port's variant (``-jax``, ``-tensorflow``: :func:`framework_image`)
is the CPU image with that framework's pip extra installed as well (the EXTRAS build argument),
so it still runs PyTorch workers, the results service and the data Job.

The build context is assembled here (the Dockerfile, pyproject.toml, README.md, LICENSE and the
``mlbench`` package, without caches), so nothing else from the checkout, such as data sets,
virtual environments or .git, is sent to the Docker engine.

``base`` replaces the Dockerfile's base image and ``pip_options`` are given to its pip installs
(e.g. ``--no-index --find-links URL`` for wheels served from a local folder): how an engine that
cannot reach a registry or PyPI builds the image, as the tests do.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from collections.abc import Callable
from typing import Any

from mlbench.version import __version__
from mlbench.errors import MlbenchError, UsageError
from mlbench.extras import needs
from mlbench.frameworks import FRAMEWORKS, get_framework
from mlbench.progress import Progress

REPOSITORY = "mlbench/worker"
TORCH_INDEX = {"cpu": "https://download.pytorch.org/whl/cpu",
               "cuda": "https://download.pytorch.org/whl/cu124"}
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_STEP = re.compile(r"^Step (\d+)/(\d+) :")


def worker_image_tag(cuda: bool = False, frameworks: tuple[str, ...] = ()) -> str:
    """The image reference for this version of mlbench, with the ports of ``frameworks``."""
    return framework_image(f"{REPOSITORY}:{__version__}{'-cuda' if cuda else ''}", *frameworks)


def port_extras(frameworks: tuple[str, ...]) -> tuple[str, ...]:
    """The pip extras of ``frameworks``' ports, each once, in :data:`~mlbench.frameworks.FRAMEWORKS`'
    order (so a variant has one name whatever order they were given in)."""
    chosen = {get_framework(name).name for name in frameworks}
    return tuple(f.extra for f in FRAMEWORKS.values() if f.name in chosen and f.extra)


def framework_image(image: str, *frameworks: str) -> str:
    """The variant of ``image`` that also has ``frameworks`` (their names appended to its tag:
    ``mlbench/worker:1.0`` -> ``mlbench/worker:1.0-jax``), as ``mlbench image build --framework``
    tags it; PyTorch, which every image has, adds nothing."""
    suffix = "".join(f"-{extra}" for extra in port_extras(frameworks))
    if not suffix:
        return image
    name, _, digest = image.partition("@")
    if digest:
        raise UsageError(f"{image} names an image by its digest, which has no framework variant; "
                         "pass the variant's own reference with --image")
    last = name.rsplit("/", 1)[-1]
    return f"{name}{suffix}" if ":" in last else f"{name}:latest{suffix}"


def source_root() -> Path:
    """The checkout mlbench runs from (the image is built from source, not from PyPI)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "docker" / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise UsageError("The worker image is built from an mlbench source checkout, and this "
                         "installation has none; clone the repository, `pip install -e .` it "
                         "and rerun, or pass --source DIR.")
    return root


def build_context(root: Path) -> io.BytesIO:
    """A tar archive of what the Dockerfile copies, with the Dockerfile at its top."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root / "docker" / "Dockerfile", arcname="Dockerfile")
        for name in ("pyproject.toml", "README.md", "LICENSE"):  # LICENSE: pyproject's license-files
            if (root / name).is_file():
                tar.add(root / name, arcname=name)
        for path in sorted((root / "mlbench").rglob("*")):
            relative = path.relative_to(root)
            if path.is_file() and not _SKIP_PARTS & set(relative.parts) \
                    and path.suffix not in (".pyc", ".pyo"):
                tar.add(path, arcname=str(relative))
    buffer.seek(0)
    return buffer


def build_image(cuda: bool = False, tag: str | None = None, root: Path | None = None,
                client: Any = None, progress: Callable[[str], None] | None = None,
                base: str | None = None, pip_options: str | None = None, network: str | None = None,
                frameworks: tuple[str, ...] = ()) -> str:
    """Build the worker image and return its tag, showing the Dockerfile's steps as progress
    (the builder's "Step N/M" lines give the count and are shown beside it); with ``progress``,
    Docker's output lines go to it as well.

    ``base``: another base image (the Dockerfile's BASE_IMAGE); ``pip_options``: added to its pip
    installs (PIP_INSTALL_OPTIONS); ``network``: the build containers' network mode (``host``
    reaches a wheel server on this machine's loopback); ``frameworks``: the ports whose pip
    extras the image installs too (the EXTRAS build argument), which run on CPUs only.
    """
    extras = port_extras(frameworks)
    if cuda and extras:
        raise UsageError("--framework: the JAX and TensorFlow ports train on CPUs; build their image "
                         "without --cuda")
    with needs("kind"):
        import docker
        import requests

    tag = tag or worker_image_tag(cuda, frameworks)
    root = root or source_root()
    if not (root / "docker" / "Dockerfile").is_file():
        raise UsageError(f"{root} has no docker/Dockerfile; pass an mlbench source checkout.")
    context = build_context(root)
    args = {"TORCH_INDEX_URL": TORCH_INDEX["cuda" if cuda else "cpu"], "MLBENCH_VERSION": __version__}
    if base:
        args["BASE_IMAGE"] = base
    if pip_options:
        args["PIP_INSTALL_OPTIONS"] = pip_options
    if extras:
        args["EXTRAS"] = " ".join(extras)
    try:
        client = client or docker.from_env()
        stream = client.api.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                  decode=True, buildargs=args, network_mode=network)
        with Progress(f"Building {tag}", unit="steps", rates=False) as shown:
            for chunk in stream:
                if "error" in chunk:
                    detail = str(chunk.get("error", "")).strip().splitlines()[-1]
                    raise MlbenchError(f"Building {tag} failed ({detail}); fix the cause (network "
                                       "access for pip, the Dockerfile) and rerun.")
                text = str(chunk.get("stream", "")).strip()
                if text and progress is not None:
                    progress(text)
                step = _STEP.match(text)
                if step:
                    shown.total = float(step.group(2))
                    shown.update(float(step.group(1)) - 1, note=text[:60])
                elif text:
                    shown.update(shown.done)
            shown.update(shown.total or shown.done, note="")
    except (docker.errors.DockerException, requests.RequestException) as err:
        raise MlbenchError(f"Docker is not running or refused the build "
                           f"({err.__class__.__name__}: {str(err)[:200]}); start Docker (or set "
                           "DOCKER_HOST) and rerun.") from None
    return tag
