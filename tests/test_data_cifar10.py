"""CIFAR-10 loader on a small real subset in the official python layout, built from the JPEG copy
in ../shared/data (200 train + 100 test images, decoded with PIL as cifar10_jpeg.py does)."""

import functools
import hashlib
import http.server
import io
import pathlib
import pickle
import shutil
import tarfile
import threading
from collections import OrderedDict

import numpy as np
import pytest
import torch
from PIL import Image

from mlbench.errors import DataError
from mlbench.tasks.data import cifar10
from mlbench.tasks.data.cifar10 import Split, default_data_root, load_cifar10

NPZ = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg.npz"
N_TRAIN, N_TEST = 200, 100
BATCHES = [f"data_batch_{i}" for i in range(1, 6)]


@pytest.fixture(scope="module")
def subset(tmp_path_factory):
    """(parent folder, images HWC uint8, labels) with parent/cifar-10-batches-py/ written."""
    if not NPZ.is_file():
        pytest.skip(f"{NPZ} is not there")
    z = np.load(NPZ)
    train = np.flatnonzero(z["split"] == 0)[:N_TRAIN]
    test = np.flatnonzero(z["split"] == 1)[:N_TEST]
    idx = np.concatenate([train, test])
    jpeg, off = z["jpeg"], z["offsets"]
    images = np.stack(
        [np.asarray(Image.open(io.BytesIO(jpeg[off[i] : off[i + 1]].tobytes())).convert("RGB")) for i in idx]
    )
    labels = z["labels"][idx].astype(np.int64)
    parent = tmp_path_factory.mktemp("cifar")
    folder = parent / "cifar-10-batches-py"
    folder.mkdir()
    rows = images.transpose(0, 3, 1, 2).reshape(len(idx), 3072)
    per_batch = N_TRAIN // 5

    def dump(name, lo, hi, protocol):
        entry = {"batch_label": name, "labels": labels[lo:hi].tolist(), "data": rows[lo:hi],
                 "filenames": [f"{i:05d}.png" for i in idx[lo:hi]]}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=protocol))

    for b, name in enumerate(BATCHES):  # protocol 2 for one file, like the Python 2 originals
        dump(name, b * per_batch, (b + 1) * per_batch, 2 if b == 0 else 4)
    dump("test_batch", N_TRAIN, N_TRAIN + N_TEST, 4)
    meta = {"label_names": [str(c) for c in z["classes"]], "num_cases_per_batch": per_batch, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=4))
    return parent, images, labels


@pytest.fixture
def copy_of(subset, tmp_path):
    """A private copy of the batches folder that a test may damage."""
    folder = tmp_path / "cifar-10-batches-py"
    shutil.copytree(subset[0] / "cifar-10-batches-py", folder)
    return folder


def test_shapes_dtypes_pixels_and_labels(subset):
    parent, images, labels = subset
    train, test = load_cifar10(parent)
    assert isinstance(train, Split) and isinstance(test, Split)
    assert train.x.shape == (N_TRAIN, 3, 32, 32) and test.x.shape == (N_TEST, 3, 32, 32)
    assert train.x.dtype == torch.uint8 and train.y.dtype == torch.int64
    assert train.y.tolist() == labels[:N_TRAIN].tolist() and test.y.tolist() == labels[N_TRAIN:].tolist()
    # x[i, c, h, w] is the batch row's value at c*1024 + h*32 + w, i.e. the RGB image's [h, w, c]
    row = pickle.loads((parent / "cifar-10-batches-py" / "data_batch_2").read_bytes())["data"][3]
    assert train.x[N_TRAIN // 5 + 3, 2, 5, 9].item() == row[2 * 1024 + 5 * 32 + 9]
    assert train.x[N_TRAIN // 5 + 3, 1, 31, 0].item() == row[1 * 1024 + 31 * 32 + 0]
    assert torch.equal(train.x.permute(0, 2, 3, 1), torch.from_numpy(images[:N_TRAIN]))
    assert torch.equal(test.x.permute(0, 2, 3, 1), torch.from_numpy(images[N_TRAIN:]))


def test_folder_itself_or_its_parent(subset):
    by_parent = load_cifar10(subset[0])
    by_folder = load_cifar10(str(subset[0] / "cifar-10-batches-py"))
    for a, b in zip(by_parent, by_folder):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_default_root_is_used_without_download(subset, tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path))
    assert default_data_root() == tmp_path
    shutil.copytree(subset[0] / "cifar-10-batches-py", tmp_path / "cifar10" / "cifar-10-batches-py")
    train, test = load_cifar10(download=False)
    assert train.x.shape[0] == N_TRAIN and test.y.tolist() == subset[2][N_TRAIN:].tolist()


def test_default_root_without_download_says_where_to_put_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path))
    with pytest.raises(DataError, match=r"CIFAR-10 is not in .*cifar10; put the official python version"):
        load_cifar10(download=False)


def test_missing_files_are_listed(copy_of):
    (copy_of / "data_batch_3").unlink()
    (copy_of / "test_batch").unlink()
    with pytest.raises(DataError) as err:
        load_cifar10(copy_of.parent)
    assert "lacks data_batch_3, test_batch;" in str(err.value)
    assert "data_batch_1" not in str(err.value).split(";")[0]


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_cifar10(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda b: b[: len(b) // 2], "not a readable CIFAR-10 batch"),
        (lambda b: b"\x00garbage" * 10, "not a readable CIFAR-10 batch"),
        (lambda b: pickle.dumps(OrderedDict(data=1)), "refers to collections.OrderedDict"),
        (lambda b: pickle.dumps({"data": np.zeros((2, 3000), np.uint8), "labels": [0, 1]}), "rows of 3072"),
        (lambda b: pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}), "one integer per row"),
        (lambda b: pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}), "outside 0..9"),
    ],
)
def test_corrupt_batch_names_the_file(copy_of, damage, reason):
    path = copy_of / "data_batch_4"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=reason) as err:
        load_cifar10(copy_of)
    assert str(path) in str(err.value)


def test_offline_download_is_one_line_with_a_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path))
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    with pytest.raises(DataError) as err:
        load_cifar10()
    message = str(err.value)
    root = tmp_path / "cifar10"
    assert message.startswith("could not download CIFAR-10 (")
    assert message.endswith(f"); put the official python version (cifar-10-batches-py/) in {root} "
                            "or pass --data-dir DIR")
    assert "\n" not in message
    assert not any(p.name.startswith(".extract-") for p in root.iterdir())


@pytest.fixture
def archive_server(subset, tmp_path):
    """A local HTTP server with the subset packed as the official tarball; yields (url, md5)."""
    served = tmp_path / "served"
    served.mkdir()
    with tarfile.open(served / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(subset[0] / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    md5 = hashlib.md5((served / "cifar-10-python.tar.gz").read_bytes()).hexdigest()
    yield f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz", md5
    server.shutdown()
    server.server_close()
    thread.join()


def test_download_extracts_into_the_cache_once(subset, archive_server, tmp_path, monkeypatch):
    url, md5 = archive_server
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(cifar10, "URL", url)
    monkeypatch.setattr(cifar10, "MD5", md5)
    train, test = load_cifar10()
    root = tmp_path / "data" / "cifar10"
    assert sorted(p.name for p in root.iterdir()) == [".lock", "cifar-10-batches-py"]  # archive removed
    assert torch.equal(train.x.permute(0, 2, 3, 1), torch.from_numpy(subset[1][:N_TRAIN]))
    monkeypatch.setattr(cifar10, "URL", "http://127.0.0.1:9/unused")  # the second load reads the cache
    assert torch.equal(load_cifar10()[1].y, test.y)


def test_download_with_wrong_md5_is_refused(archive_server, tmp_path, monkeypatch):
    url, _ = archive_server
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(cifar10, "URL", url)
    monkeypatch.setattr(cifar10, "MD5", "0" * 32)
    with pytest.raises(DataError, match=r"could not download CIFAR-10 \(the download of .* is damaged"):
        load_cifar10()
    assert not (tmp_path / "data" / "cifar10" / "cifar-10-batches-py").exists()
