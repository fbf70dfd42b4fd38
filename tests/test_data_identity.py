"""What data a run trained on (mlbench.tasks.data.identity): the official data sets are told apart
from rebuilds, subsets and look-alikes by the loaders' own files, and every file is hashed once.

The official files cannot be downloaded here: the official path is shown on small stand-ins whose
md5s or counts the tests put in place of the published ones."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlbench.errors import DataError, UsageError
from mlbench.tasks.data import identity
from mlbench.tasks.data.identity import DIGEST_CACHE, DataIdentity, data_identity
from tests.conftest import SHARED_DATA, decode_cifar_subset, write_cifar_python_layout, write_libsvm

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def data_root() -> Path:
    return Path(os.environ["MLBENCH_DATA"])  # each test's own (tests/conftest.py's isolated_home)


# --- CIFAR-10 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rebuild(tmp_path_factory) -> Path:
    """All 60,000 images of ../shared/data rebuilt in the official layout by its own script."""
    script = SHARED_DATA / "cifar10_jpeg.py"
    if not script.is_file():
        pytest.skip(f"{script} is not there")
    spec = importlib.util.spec_from_file_location("cifar10_jpeg", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("cifar-rebuild")
    module.write_batches(str(out))
    return out


@pytest.fixture
def stand_in(tmp_path) -> Path:
    """A tiny CIFAR-10 of random images in the official layout: 5 x 2 training, 3 test images."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (13, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 13)
    return write_cifar_python_layout(tmp_path / "stand-in", images[:10], labels[:10], images[10:], labels[10:])


def md5s(folder: Path) -> dict[str, str]:
    return {name: hashlib.md5((folder / "cifar-10-batches-py" / name).read_bytes()).hexdigest() for name in BATCHES}


def test_the_shared_data_rebuild_is_not_official_and_its_reason_names_the_files(rebuild):
    found = data_identity("cifar10", str(rebuild))
    assert not found.official
    assert found.reason == ("not the official CIFAR-10 files (the md5s of data_batch_1, data_batch_2, data_batch_3, "
                            "data_batch_4, data_batch_5 and test_batch differ)")
    assert found.rows == {"train": 50_000, "test": 10_000}
    assert found.features is None
    assert [f["name"] for f in found.files] == BATCHES


def test_a_subset_says_its_counts(tmp_path):
    folder = write_cifar_python_layout(tmp_path, *decode_cifar_subset(1500, 300))
    found = data_identity("cifar10", str(folder))
    assert not found.official
    assert found.reason == "1,500 training images, not CIFAR-10's 50,000; 300 test images, not CIFAR-10's 10,000"
    assert found.rows == {"train": 1500, "test": 300}


def test_files_with_the_official_md5s_are_official(stand_in, monkeypatch):
    monkeypatch.setattr(identity, "CIFAR10_MD5", md5s(stand_in))
    found = data_identity("cifar10", str(stand_in))
    assert found.official and found.reason is None
    assert found.rows == {"train": 10, "test": 3}


def test_one_file_of_other_bytes_is_named_by_its_md5(stand_in, monkeypatch):
    monkeypatch.setattr(identity, "CIFAR10_MD5", md5s(stand_in))
    monkeypatch.setattr(identity, "CIFAR10_ROWS", {"train": 10, "test": 3})
    batch = stand_in / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(pickle.dumps(pickle.loads(batch.read_bytes()), protocol=2))  # the same images, pickled again
    found = data_identity("cifar10", str(stand_in))
    assert not found.official
    assert found.reason == "not the official CIFAR-10 files (data_batch_3's md5 differs)"


def test_the_same_bytes_give_the_same_sha256_and_other_bytes_another(stand_in, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(stand_in, copy)
    batches = copy / "cifar-10-batches-py"
    first, second = data_identity("cifar10", str(stand_in)), data_identity("cifar10", str(batches))
    assert first.sha256 == second.sha256 and first.files == second.files
    one = batches / "data_batch_1"
    assert first.files[0] == {"name": "data_batch_1", "bytes": one.stat().st_size,
                              "sha256": hashlib.sha256(one.read_bytes()).hexdigest()}
    batch = batches / "test_batch"
    entry = pickle.loads(batch.read_bytes())
    entry["labels"][0] = (entry["labels"][0] + 1) % 10
    batch.write_bytes(pickle.dumps(entry, protocol=4))
    assert data_identity("cifar10", str(copy)).sha256 != first.sha256


def test_without_a_data_dir_the_default_folder_is_read(stand_in):
    shutil.copytree(stand_in, data_root() / "cifar10")
    assert data_identity("cifar10", None).sha256 == data_identity("cifar10", str(stand_in)).sha256


def test_missing_files_are_a_data_error_of_one_line(stand_in, tmp_path):
    (stand_in / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DataError, match=r"^CIFAR-10 in .* lacks test_batch; [^\n]*$"):
        data_identity("cifar10", str(stand_in))
    with pytest.raises(DataError, match=r"^CIFAR-10 in .* lacks data_batch_1, .* and test_batch; [^\n]*$"):
        data_identity("cifar10", None)
    with pytest.raises(DataError, match=r"^the data folder .*nowhere does not exist; [^\n]*$"):
        data_identity("cifar10", str(tmp_path / "nowhere"))


def test_an_unknown_data_set_is_a_usage_error():
    with pytest.raises(UsageError, match=r"unknown data set 'imagenet'; mlbench knows cifar10, epsilon, wikitext2, "
                                         r"wmt17-en-de and fineweb10B"):
        data_identity("imagenet", None)


# --- epsilon and any LIBSVM pair ----------------------------------------------------------------


def libsvm_pair(folder: Path, train: str, rows: int, test_rows: int, width: int) -> Path:
    """A LIBSVM pair train / train.t whose widest row uses feature `width`, cached by the loader."""
    from mlbench.tasks.data.libsvm import load_libsvm_dataset

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for name, n in ((train, rows), (f"{train}.t", test_rows)):
        x = rng.normal(size=(n, width))
        write_libsvm(folder / name, x, np.where(x[:, 0] > 0, 1, -1))
    load_libsvm_dataset(folder, name="epsilon")
    return folder


def test_a_3000_row_file_named_epsilon_is_not_official(tmp_path):
    folder = libsvm_pair(tmp_path / "eps", "epsilon_normalized", 3000, 600, 5)
    found = data_identity("epsilon", str(folder))
    assert not found.official
    assert found.reason == ("3,000 training rows, not epsilon's 400,000; 600 test rows, not epsilon's 100,000; "
                            "5 features, not epsilon's 2,000")
    assert found.rows == {"train": 3000, "test": 600} and found.features == 5
    assert [f["name"] for f in found.files] == ["epsilon_normalized", "epsilon_normalized.t"]


def test_another_libsvm_data_set_is_named_in_the_reason(tmp_path):
    folder = libsvm_pair(tmp_path / "a9a", "a9a", 40, 10, 3)
    found = data_identity("epsilon", str(folder))
    assert not found.official and found.reason == "a9a, not epsilon"
    assert found.rows == {"train": 40, "test": 10} and found.features == 3


def test_a_pair_of_epsilons_names_and_specified_shape_is_official(tmp_path, monkeypatch):
    folder = libsvm_pair(tmp_path / "eps", "epsilon_normalized", 30, 6, 4)
    monkeypatch.setattr(identity, "EPSILON_ROWS", {"train": 30, "test": 6})
    monkeypatch.setattr(identity, "EPSILON_FEATURES", 4)
    found = data_identity("epsilon", str(folder))
    assert found.official and found.reason is None


def test_a_libsvm_file_without_its_binary_cache_is_a_data_error(tmp_path):
    folder = tmp_path / "eps"
    folder.mkdir()
    for name in ("epsilon_normalized", "epsilon_normalized.t"):
        write_libsvm(folder / name, np.ones((3, 2)), np.ones(3))
    with pytest.raises(DataError, match=r"epsilon_normalized has no current binary cache in .*; load the data set "
                                        r"once [^\n]*$"):
        data_identity("epsilon", str(folder))


# --- Wikitext-2 ---------------------------------------------------------------------------------

WIKI = {"wiki.train.tokens": " = Title = \n\n The cat sat on the mat . \n The dog sat . \n",
        "wiki.valid.tokens": " A cat . \n", "wiki.test.tokens": " The end \n"}


def wiki_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in WIKI.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_small_wikitext_files_are_not_official_and_give_the_tokenizers_counts(tmp_path):
    from mlbench.tasks.task3a.wikitext import load_wikitext2, tokenize

    folder = wiki_folder(tmp_path / "wiki")
    streams, vocab = tokenize([folder / name for name in WIKI])
    counted = data_identity("wikitext2", str(folder))
    assert counted.rows == {"train": len(streams[0]), "valid": len(streams[1]), "test": len(streams[2])} == \
        {"train": 18, "valid": 4, "test": 3}
    assert not counted.official
    assert counted.reason == ("18 training tokens, not Wikitext-2's 2,088,628; 4 validation tokens, not Wikitext-2's "
                              f"217,646; 3 test tokens, not Wikitext-2's 245,569; a vocabulary of {len(vocab)} words, "
                              "not Wikitext-2's 33,278")
    load_wikitext2(folder)
    assert data_identity("wikitext2", str(folder)) == counted


def test_wikitext_counts_come_from_the_loaders_cache_while_it_is_current(tmp_path):
    from mlbench.tasks.task3a.wikitext import load_wikitext2

    folder = wiki_folder(tmp_path / "wiki")
    load_wikitext2(folder)
    [entry] = (data_root() / "wikitext2-cache").glob("*/train.npy")
    np.save(entry, np.zeros(7, dtype=np.int32))  # the cache now says 7 training tokens
    assert data_identity("wikitext2", str(folder)).rows["train"] == 7
    train = folder / "wiki.train.tokens"
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))  # the cache is outdated
    assert data_identity("wikitext2", str(folder)).rows["train"] == 18


def test_wikitext_of_the_published_counts_is_official(tmp_path, monkeypatch):
    wiki_folder(tmp_path / "wiki" / "wikitext-2")
    monkeypatch.setattr(identity, "WIKITEXT2_TOKENS", {"train": 18, "valid": 4, "test": 3})
    monkeypatch.setattr(identity, "WIKITEXT2_VOCAB", 13)
    found = data_identity("wikitext2", str(tmp_path / "wiki"))
    assert found.official and found.reason is None


# --- WMT17 en-de ---------------------------------------------------------------------------------


def wmt_folder(folder: Path, train: int, test: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", train), ("newstest2014", test)):
        (folder / f"{stem}.en").write_text("".join(f"sentence {i}\n" for i in range(n)), encoding="utf-8")
        (folder / f"{stem}.de").write_text("".join(f"Satz {i}\n" for i in range(n)), encoding="utf-8")
    return folder


def test_small_wmt_files_are_not_official_and_give_their_pairs(tmp_path):
    found = data_identity("wmt17-en-de", str(wmt_folder(tmp_path / "wmt", 5, 12)))
    assert not found.official
    assert found.reason == "12 test sentence pairs, not newstest2014's 3,003"
    assert found.rows == {"train": 5, "test": 12}
    assert [f["name"] for f in found.files] == ["train.en", "train.de", "newstest2014.en", "newstest2014.de"]


def test_wmt_with_newstest2014s_3003_pairs_is_official(tmp_path):
    found = data_identity("wmt17-en-de", str(wmt_folder(tmp_path / "wmt", 5, 3003)))
    assert found.official and found.reason is None and found.rows == {"train": 5, "test": 3003}


def test_wmt_files_missing_or_not_aligned_are_a_data_error(tmp_path):
    folder = wmt_folder(tmp_path / "wmt", 5, 12)
    (folder / "train.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.en has 5 lines but .*train.de has 2; [^\n]*$"):
        data_identity("wmt17-en-de", str(folder))
    (folder / "newstest2014.en").unlink()
    with pytest.raises(DataError, match=r"newstest2014.en is missing; [^\n]*$"):
        data_identity("wmt17-en-de", str(folder))


# --- the digests, computed once -------------------------------------------------------------------


def test_each_file_is_hashed_once_and_kept_by_path_size_and_mtime(tmp_path):
    folder = wmt_folder(tmp_path / "wmt", 5, 12)
    data_identity("wmt17-en-de", str(folder))
    cache = json.loads((data_root() / DIGEST_CACHE).read_text())
    train = (folder / "train.en").resolve()
    assert cache[str(train)] == {"size": train.stat().st_size, "mtime_ns": train.stat().st_mtime_ns, "lines": 5,
                                 "sha256": hashlib.sha256(train.read_bytes()).hexdigest()}
    cache[str(train)]["sha256"] = "f" * 64  # read from the cache, not hashed again, while the file is unchanged
    (data_root() / DIGEST_CACHE).write_text(json.dumps(cache))
    assert data_identity("wmt17-en-de", str(folder)).files[0]["sha256"] == "f" * 64
    train.write_text("another first sentence\n" * 5, encoding="utf-8")
    rehashed = data_identity("wmt17-en-de", str(folder)).files[0]["sha256"]
    assert rehashed == hashlib.sha256(train.read_bytes()).hexdigest()


def test_a_data_folder_that_cannot_be_written_still_gets_an_identity(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "a-file" / "data"))  # no folder can be made there, even by root
    found = data_identity("wmt17-en-de", str(wmt_folder(tmp_path / "wmt", 5, 12)))
    assert found.rows == {"train": 5, "test": 12}
    assert not (tmp_path / "a-file" / "data").exists()


def test_an_identity_survives_json(tmp_path):
    found = data_identity("wmt17-en-de", str(wmt_folder(tmp_path / "wmt", 5, 12)))
    assert DataIdentity.from_dict(json.loads(json.dumps(found.to_dict()))) == found


# --- torch-free, and its own facts agree with the loaders' ---------------------------------------------


def test_the_module_imports_no_torch():
    code = "import sys, mlbench.tasks.data.identity; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_md5_table_names_exactly_the_files_the_loader_reads():
    from mlbench.tasks.data import cifar10_layout

    assert set(identity.CIFAR10_MD5) == set(cifar10_layout.FILES) == set(BATCHES)


def test_epsilons_specified_width_is_the_one_its_synthetic_stand_in_has():
    from mlbench.tasks import datasets

    assert identity.EPSILON_FEATURES == datasets.EPSILON_FEATURES
