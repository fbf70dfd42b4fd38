"""The real worker image, built by docker/Dockerfile on the local node's engine, which can pull nothing.

- The base: a debootstrap of Debian bookworm (minbase + python3 with its venv module),
  ``docker import``ed: the Dockerfile's default base (python's official image) cannot be pulled here.
  Its root filesystem is kept as an archive, so debootstrap runs once per machine.
- The wheels: this machine's torch and torchvision (the versions installed here, with their
  dependencies, CUDA libraries included: the torch here is a CUDA build, and the only CPU build on
  this machine has no matching torchvision) and every dependency of mlbench, collected once with
  ``pip download`` from this machine's index, and served over HTTP on 127.0.0.1 to the build.
- The image: :func:`mlbench.cloud.image.build_image` (the product's build) with the base as the
  BASE_IMAGE argument, ``--no-index --find-links`` to the wheel server as PIP_INSTALL_OPTIONS,
  and host networking for the build's containers.

Images stay in the engine's data root, which the node keeps between test sessions
(tests/kube/node.py), tagged ``mlbench/worker:test-<hash>`` of the Dockerfile, the wheels and the
mlbench sources. A change of the sources rebuilds only the layers after torch's: the wheel server
listens on a port derived from the wheels' hash, so the build arguments, and with them Docker's
layer cache, stay the same.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker

from mlbench.cloud.image import build_context, build_image
from tests.kube.node import NodeUnavailable

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("MLBENCH_TEST_IMAGE_CACHE", Path.home() / ".cache" / "mlbench-test-images"))
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REPO, WORKER_REPO = "mlbench-test/bookworm-python", "mlbench/worker"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _run(command: list[str], what: str, timeout: float, **kwargs: Any) -> str:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def _docker(host: str, *args: str, timeout: float = 900) -> str:
    return _run(["docker", *args], f"docker {args[0]}", timeout=timeout, env={**os.environ, "DOCKER_HOST": host})


def _has(host: str, tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True,
                          env={**os.environ, "DOCKER_HOST": host}).returncode == 0


def base_image(host: str, building: Callable[[], None] = lambda: None) -> str:
    """Debian bookworm with python3, as an image on the engine at ``host`` (``building`` is
    called before anything is made)."""
    key = _digest(SUITE, MIRROR, *BASE_PACKAGES, "minbase-1")
    tag = f"{BASE_REPO}:{key}"
    if _has(host, tag):
        return tag
    building()
    archive = CACHE / f"base-{key}.tar"
    if not archive.exists():
        if shutil.which("debootstrap") is None:
            raise NodeUnavailable("debootstrap is not installed (apt-get install debootstrap)")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="mlbench-base-", dir=CACHE) as tmp:
            root = Path(tmp) / "root"
            try:
                _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE,
                      str(root), MIRROR], "debootstrap of Debian bookworm", timeout=1800)
            finally:  # debootstrap mounts /proc and /sys in the target; an interruption leaves them
                _unmount_under(root)
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for path in (root / leftover).glob("*"):
                    if path.is_file():
                        path.unlink()
            tarball = Path(tmp) / "rootfs.tar"
            _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tarball), "."], "tar of the base",
                 timeout=900)
            os.replace(tarball, archive)
    _docker(host, "import", str(archive), tag)
    return tag


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _made_once(name: str, key: str, building: Callable[[], None], fill: Callable[[Path], None]) -> Path:
    """CACHE/NAME-KEY, unless it is there made by ``fill`` in a staging folder (after
    ``building()``) and then moved in place, the older NAME-* folders removed."""
    folder = CACHE / f"{name}-{key}"
    if folder.is_dir():
        return folder
    building()
    staging = CACHE / f".{name}-{key}.part"
    shutil.rmtree(staging, ignore_errors=True)
    fill(staging)
    for old in CACHE.glob(f"{name}-*"):
        shutil.rmtree(old, ignore_errors=True)
    os.replace(staging, folder)
    return folder


def _torch_pins() -> list[str]:
    from importlib.metadata import version

    return [f"torch=={version('torch')}", f"torchvision=={version('torchvision')}"]


def wheelhouse(building: Callable[[], None] = lambda: None) -> Path:
    """torch and torchvision as installed here, and every dependency of mlbench, as wheels (made
    once per machine, kept in :data:`CACHE`; ``building`` is called before they are downloaded)."""
    import tomllib

    pins = _torch_pins()
    # what the image installs: the core and the kubernetes extra (not pyproject.toml as a whole,
    # whose other edits need no new wheels)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = [*project["dependencies"], *project["optional-dependencies"]["kubernetes"]]

    def fill(staging: Path) -> None:
        previous = max(CACHE.glob("wheels-*"), key=lambda p: p.stat().st_mtime, default=None)
        if previous is not None:  # pip download skips the wheels already there: torch is not fetched again
            shutil.copytree(previous, staging)
        staging.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(staging), *pins,
              "setuptools>=68", "wheel"], "pip download of torch's wheels", timeout=3600)
        _run([sys.executable, "-m", "pip", "download", "-q", "-d", str(staging), *pins, f"{REPO}[kubernetes]"],
             "pip download of mlbench's dependencies", timeout=1800)
        for leftover in staging.glob("mlbench-*"):  # the checkout itself is installed from source
            leftover.unlink()

    return _made_once("wheels", _digest(*pins, json.dumps(needed), "wheels-3"), building, fill)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder without a log line per request."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_folder(folder: Path, preferred_port: int) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 listing ``folder`` (pip's --find-links); its URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", preferred_port), handler)
    except OSError:  # taken: any port (Docker's layer cache then misses once)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def worker_image(host: str, log: Path, building: Callable[[], None] = lambda: None) -> str:
    """docker/Dockerfile built on the engine at ``host`` from the local base and wheels; its tag.

    ``building`` is called before anything that is not cached yet is made: on a new machine the
    base, the wheels and the image take 15-40 minutes (tests/kube/conftest.py lifts the test's
    time limit then)."""
    base = base_image(host, building)
    wheels = wheelhouse(building)
    names = sorted(w.name for w in wheels.glob("*.whl"))
    key = _digest(base, json.dumps(names), build_context(REPO).getvalue())
    tag = f"{WORKER_REPO}:test-{key}"
    if _has(host, tag):
        return tag
    building()
    with serve_folder(wheels, _wheel_port(names)) as url, open(log, "a", encoding="utf-8") as out:
        build_image(tag=tag, root=REPO, client=docker.DockerClient(base_url=host, timeout=3600), base=base,
                    pip_options=f"--no-index --find-links {url}", network="host",
                    progress=lambda line: print(line, file=out, flush=True))
    _remove_other_tags(host, f"{WORKER_REPO}:test-", tag)
    return tag


def _wheel_port(names: list[str]) -> int:
    """The wheel server's port for the wheels ``names``: the same wheels, the same build arguments."""
    return 20000 + int(_digest(json.dumps(names)), 16) % 20000


def _remove_other_tags(host: str, prefix: str, *keep: str) -> None:
    for line in _docker(host, "images", WORKER_REPO, "--format", "{{.Repository}}:{{.Tag}}").split():
        if line.startswith(prefix) and line not in keep:
            _docker(host, "rmi", "--force", line)   # untagged even where an old container still refers to it


#: the ports whose variant of the worker image the real node's port test runs (one image with both)
PORTS = ("jax", "tensorflow")


def port_wheelhouse(building: Callable[[], None] = lambda: None) -> Path:
    """The wheels the ports' extras add to :func:`wheelhouse`'s (JAX, Optax, TensorFlow and
    theirs), resolved together with those and kept apart from them (made once per machine)."""
    import tomllib

    base = wheelhouse(building)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = [d for extra in PORTS for d in project["optional-dependencies"][extra]]

    def fill(staging: Path) -> None:
        shutil.copytree(base, staging, copy_function=os.link)   # pip download skips what is there
        _run([sys.executable, "-m", "pip", "download", "-q", "-d", str(staging), *_torch_pins(),
              f"{REPO}[kubernetes,{','.join(PORTS)}]"], "pip download of the ports' dependencies", timeout=1800)
        for wheel in staging.iterdir():
            if (base / wheel.name).exists() or wheel.name.startswith("mlbench-"):
                wheel.unlink()

    return _made_once("port-wheels", _digest(base.name, json.dumps(needed), "port-wheels-1"), building, fill)


def port_image(host: str, log: Path, building: Callable[[], None] = lambda: None) -> str:
    """The variant of :func:`worker_image`'s image with the ports (``mlbench image build
    --framework jax --framework tensorflow``), also tagged as that image's ``-jax`` and
    ``-tensorflow`` variants, which a run of each framework uses on a cluster whose image is
    the base one (:func:`mlbench.launch.kubernetes.worker_image`); the base tag.

    It shares the base image's PyTorch layer: its build is served the base wheels and the
    ports' together from one folder, on the port the base build's server had, so its build
    arguments up to that layer are the base build's."""
    tag = worker_image(host, log, building)
    base, wheels, extra = base_image(host), wheelhouse(), port_wheelhouse(building)
    names = sorted(w.name for w in wheels.glob("*.whl"))
    extra_names = sorted(w.name for w in extra.glob("*.whl"))
    variant = f"{WORKER_REPO}:ports-{_digest(tag, json.dumps(extra_names))}"
    if not _has(host, variant):
        building()
        with tempfile.TemporaryDirectory(prefix="mlbench-wheels-") as merged:
            for wheel in [*wheels.glob("*.whl"), *extra.glob("*.whl")]:
                (Path(merged) / wheel.name).symlink_to(wheel)
            with serve_folder(Path(merged), _wheel_port(names)) as url, open(log, "a", encoding="utf-8") as out:
                build_image(tag=variant, root=REPO, client=docker.DockerClient(base_url=host, timeout=3600),
                            base=base, pip_options=f"--no-index --find-links {url}", network="host",
                            progress=lambda line: print(line, file=out, flush=True), frameworks=PORTS)
        _remove_other_tags(host, f"{WORKER_REPO}:ports-", variant)
    for framework in PORTS:
        _docker(host, "tag", variant, f"{tag}-{framework}")
    return tag
