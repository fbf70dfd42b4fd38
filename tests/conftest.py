"""Shared fixtures: an isolated run store per test and small real data sets.

Real data comes from ../shared/data (all 60,000 CIFAR-10 images as JPEG bytes, see its README);
tests decode a small subset into the official python layout, so the product's own CIFAR-10
reader reads it exactly as it reads the official download.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MLBENCH_SHARED_DATA", REPO.parent / "shared" / "data"))
CIFAR_NPZ = SHARED_DATA / "cifar10-jpeg.npz"


def pytest_configure(config):
    from tests.cpu_profile import register

    register(config)
    bytecode_for_the_suites_interpreters()
    ctrl_c_reaches_the_tests_commands()
    one_torch_thread_in_the_test_process()
    flop_counter_before_tensorflow()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    """The unit lane forbids starting processes (tests/lanes.py): after every plugin's set-up
    (torch's import runs ldconfig, pytest-benchmark runs ``file``), in the processes that run
    tests: xdist's workers, or the one process of -n 0."""
    from tests.lanes import forbid_processes, in_unit_lane

    config = session.config
    runs_tests = hasattr(config, "workerinput") or config.getoption("numprocesses", None) in (None, 0)
    if in_unit_lane(config.getoption("markexpr", "") or "") and runs_tests:
        forbid_processes()


def bytecode_for_the_suites_interpreters() -> None:
    """Where the environment forbids bytecode files (``PYTHONDONTWRITEBYTECODE=1``, as on this
    project's machines and CI's), every fresh interpreter the suite starts (Slurm's job
    supervisors and tasks, torchrun's and mpirun's workers, the zygote of each test process,
    subprocesses of tests) compiles mlbench's modules again, about 0.2 CPU-seconds each, and every
    test process rewrites and compiles every test module. The test processes (xdist's workers
    inherit this from the controller) and what they start write them instead, into the
    checkout's ``__pycache__`` folders, which git ignores and the worker image's build context
    leaves out (mlbench.cloud.image.build_context). Site-packages were compiled when installed."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def ctrl_c_reaches_the_tests_commands() -> None:
    """The tests press Ctrl-C (SIGINT) on the commands they start, as a user does on a command in
    the foreground. A suite started in the background by a non-interactive shell (``cmd &``, as
    ``nohup`` jobs and CI harnesses do) inherits SIGINT *ignored*; Python then keeps it ignored,
    and so does every process it starts: the tests' CLIs ignored the Ctrl-C and ran on (seen in
    tests/test_forked_workers.py, only when an earlier test in the same worker happened to set a
    handler of its own; the kernel showed SIGINT in the CLI's ignored mask). The test processes
    take Python's own handler back, which every command they start then gets as the default."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def one_torch_thread_in_the_test_process() -> None:
    """The references a test computes in its own process use one thread of PyTorch, as each
    worker of a run here has. With two, every parallel region's idle thread spins in OpenMP's
    wait for its peer: on the loaded 2-core CI box, where the peer waits for a core, the float64
    ResNet reference of test_fast_steps cost 28 CPU-seconds against 3 idle. A test that needs a
    worker's thread count sets it (test_exactness); runs' processes set their own."""
    import torch

    torch.set_num_threads(1)


def flop_counter_before_tensorflow() -> None:
    """Tests import TensorFlow into their own process (the ports' references, tensorboard's
    readers) and count FLOPs with torch's flop counter in it (test_sysmetrics, the language
    tasks): in that order the counter's triton crashes the process (mlbench.tasks.flops.
    load_flop_counter), which, in one pytest process (``-n 0``), ended the session at a test of
    tests/results. Loaded first, it never does."""
    from mlbench.tasks.flops import load_flop_counter

    load_flop_counter()


# -- parallel sessions: pytest-xdist's workers (tests/scheduling.py) ---------------------------
@pytest.hookimpl(tryfirst=True)   # the unit marks before -m selects by them
def pytest_collection_modifyitems(config, items):
    from tests.lanes import UNIT_MODULES
    from tests.scheduling import order_items

    for item in items:
        if item.nodeid.split("::")[0] in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)
    order_items(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    from tests.scheduling import worker_count

    return worker_count()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.scheduling import WholePackageScheduling

    return WholePackageScheduling(config, log)


#: where a ``ram_home`` test keeps its run store, when it is a tmpfs with this much room
RAM_DISK, RAM_HOME_MIN_FREE = Path("/dev/shm"), 1 << 30


def ram_disk() -> Path | None:
    """:data:`RAM_DISK` when it is a tmpfs with :data:`RAM_HOME_MIN_FREE` bytes free, else None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        free = os.statvfs(RAM_DISK)
    except OSError:
        return None
    tmpfs = any(line.split()[1:3] == [str(RAM_DISK), "tmpfs"] for line in mounts if len(line.split()) > 2)
    return RAM_DISK if tmpfs and free.f_bavail * free.f_frsize >= RAM_HOME_MIN_FREE else None


@pytest.fixture(autouse=True)
def isolated_home(request, tmp_path_factory, monkeypatch):
    """Every test gets its own run store, config folder and data cache (never the user's).

    A test marked ``ram_home`` gets them on a tmpfs where there is one: its runs checkpoint
    every few steps, and each checkpoint is fsync'ed (mlbench.safefile), which on the loaded CI
    box, beside the other workers' Docker engine, kubelet and Slurm, made a run of 1,500
    one-step checkpoints take 170 s instead of 10 (45 s against 15 with the busy loops alone).
    What such a test checks (the parameters after a restart) does not depend on the disk.

    A test that fails half-way (a timeout before its Ctrl-C was answered) must not leave its
    run training for the rest of the session: afterwards, the supervisor of every local run
    still active in its store is killed, and its workers with it (they die with their parent)."""
    ram = ram_disk() if request.node.get_closest_marker("ram_home") else None
    base = Path(tempfile.mkdtemp(prefix="mlbench-env-", dir=ram)) if ram else tmp_path_factory.mktemp("mlbench-env")
    monkeypatch.setenv("MLBENCH_HOME", str(base / "home"))
    monkeypatch.setenv("MLBENCH_CONFIG_DIR", str(base / "config"))
    monkeypatch.setenv("MLBENCH_DATA", str(base / "data-cache"))
    yield base / "home"
    end_local_runs_left_active(base / "home")
    if ram:
        shutil.rmtree(base, ignore_errors=True)


def end_local_runs_left_active(home: Path) -> None:
    """SIGKILL the supervisor (the CLI, or the detached one) of each active local run in ``home``."""
    if not (home / "runs.db").exists():
        return
    from mlbench.errors import MlbenchError
    from mlbench.launch.supervisor import supervisor_of
    from mlbench.results.store import RunStore

    try:
        runs = RunStore(home, read_only=True).list()
    except MlbenchError:   # a store the test broke on purpose (a corrupt catalog) ran nothing
        return
    for run in runs:
        supervisor = supervisor_of(run) if run.active and run.launcher == "local" else None
        if supervisor is not None and supervisor.pid != os.getpid() and supervisor.alive():
            os.kill(supervisor.pid, signal.SIGKILL)


def decode_cifar_subset(n_train: int, n_test: int, seed: int = 0):
    """(train_images, train_labels, test_images, test_labels): uint8 [N,32,32,3] real CIFAR-10."""
    from PIL import Image

    if not CIFAR_NPZ.exists():
        pytest.skip(f"real CIFAR-10 data not found at {CIFAR_NPZ}")
    z = np.load(CIFAR_NPZ)
    jpeg, offsets, labels, split = z["jpeg"], z["offsets"], z["labels"], z["split"]
    rng = np.random.default_rng(seed)
    out = []
    for which, n in ((0, n_train), (1, n_test)):
        idx = np.sort(rng.choice(np.flatnonzero(split == which), size=n, replace=False))
        imgs = np.stack([np.asarray(Image.open(io.BytesIO(jpeg[offsets[i]:offsets[i + 1]].tobytes())).convert("RGB"))
                         for i in idx])
        out += [imgs, labels[idx].astype(np.int64)]
    return tuple(out)


def write_cifar_python_layout(root: Path, train_x, train_y, test_x, test_y) -> Path:
    """The official `cifar-10-batches-py` layout (5 train batches, test_batch, batches.meta)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name, images, labels):
        data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": labels.tolist(), "data": data,
                         "filenames": [f"{i}.png" for i in range(len(images))]}, f, protocol=4)

    for b, part in enumerate(np.array_split(np.arange(len(train_x)), 5)):
        dump(f"data_batch_{b + 1}", train_x[part], train_y[part])
    dump("test_batch", test_x, test_y)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                     "horse", "ship", "truck"], "num_cases_per_batch": 10000,
                     "num_vis": 3072}, f, protocol=4)
    return root


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory) -> Path:
    """A real CIFAR-10 subset (2,000 train / 500 test images) in the official python layout."""
    root = tmp_path_factory.mktemp("cifar-subset")
    return write_cifar_python_layout(root, *decode_cifar_subset(2000, 500))


@pytest.fixture(scope="session")
def cifar_small_dir(tmp_path_factory) -> Path:
    """A smaller real CIFAR-10 subset (512 train / 128 test images), for runs of task 1a whose
    claim is about what a run records and shows, not its numbers: each image a ResNet-20 trains
    on or evaluates costs the loaded CI box CPU time (docs/testing.md)."""
    root = tmp_path_factory.mktemp("cifar-small")
    return write_cifar_python_layout(root, *decode_cifar_subset(512, 128))


def write_libsvm(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """A LIBSVM text file (sparse: zero features omitted), labels -1/+1."""
    with open(path, "w") as f:
        for row, label in zip(x, y):
            feats = " ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(row) if v != 0)
            f.write(f"{int(label):+d} {feats}\n")
    return path


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Runs made once per session for every test that reads them (tests/shared_runs.py)."""
    from tests.shared_runs import SharedRuns, session_root

    return SharedRuns(session_root(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def libsvm_dir(tmp_path_factory) -> Path:
    """A linearly separable-ish binary problem as a LIBSVM pair `small` / `small.t` (40 features)."""
    root = tmp_path_factory.mktemp("libsvm")
    rng = np.random.default_rng(0)
    w = rng.normal(size=40)
    for name, n in (("small", 2000), ("small.t", 500)):
        x = rng.normal(size=(n, 40)) * (rng.random((n, 40)) < 0.5)
        y = np.where(x @ w + 0.1 * rng.normal(size=n) >= 0, 1, -1)
        write_libsvm(root / name, x, y)
    return root
