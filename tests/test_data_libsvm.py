"""LIBSVM reader, binary cache and data-set discovery, on files the tests write."""

import bz2
import os
import pathlib
import re

import numpy as np
import pytest
import torch

from mlbench.errors import DataError
from mlbench.tasks.data import libsvm, libsvm_text
from mlbench.tasks.data.libsvm import find_pair, load_libsvm_dataset, read_libsvm

# Omitted indices, a label-only line, a blank line, CRLF, tabs, '+1'.
TEXT = b"1 1:2 3:0.5\n\n0\n0 2:-1e-3 5:4\r\n1\t1:1  4:7.25\n"
X = np.array(
    [[2, 0, 0.5, 0, 0], [0, 0, 0, 0, 0], [0, -1e-3, 0, 0, 4], [1, 0, 0, 7.25, 0]],
    dtype=np.float32,
)
Y = np.array([1, -1, -1, 1], dtype=np.float32)
SIGNED = TEXT.replace(b"0 2:", b"-1 2:").replace(b"\n0\n", b"\n-1\n").replace(b"1 3:", b"+1 3:")


def write(path: pathlib.Path, data: bytes, compress: bool = False) -> pathlib.Path:
    path.write_bytes(bz2.compress(data) if compress else data)
    return path


def test_plain_file_01_labels(tmp_path):
    x, y = read_libsvm(write(tmp_path / "f", TEXT), cache_dir=tmp_path / "cache")
    assert x.dtype == np.float32 and y.dtype == np.float32
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)


def test_bz2_file_signed_labels(tmp_path):
    assert SIGNED != TEXT
    x, y = read_libsvm(write(tmp_path / "f.bz2", SIGNED, compress=True), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)


def test_n_features_pads_and_limits(tmp_path):
    path = write(tmp_path / "f", TEXT)
    x, _ = read_libsvm(path, n_features=7, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(x, np.pad(X, ((0, 0), (0, 2))))
    with pytest.raises(DataError, match=r"f, line 4: feature index 5 exceeds n_features=4; raise n_features$"):
        read_libsvm(path, n_features=4, cache_dir=tmp_path / "cache")


def test_comments_and_qid_are_accepted(tmp_path):
    text = b"# header comment\n1 qid:3 2:1.5 # trailing\n0 qid:3 1:2\n"
    x, y = read_libsvm(write(tmp_path / "f", text), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(x, [[0, 1.5], [2, 0]])
    np.testing.assert_array_equal(y, [1, -1])


def random_file(rng, rows, max_index):
    x = np.zeros((rows, max_index), dtype=np.float32)
    lines = []
    for i in range(rows):
        k = rng.integers(0, 6)
        idx = np.sort(rng.choice(max_index, k, replace=False))  # LIBSVM's ascending indices
        vals = rng.standard_normal(k).astype(np.float32)
        x[i, idx] = vals
        pairs = " ".join(f"{j + 1}:{v!r}" for j, v in zip(idx, vals.tolist()))
        lines.append(f"{rng.choice(['0', '1', '-1', '+1'])} {pairs}".rstrip())
    return x, ("\n".join(lines) + "\n").encode()


def test_fast_and_line_parser_agree(tmp_path):
    _, text = random_file(np.random.default_rng(1), 300, 40)
    fast = libsvm_text.parse_fast(text)
    slow = libsvm_text.parse_lines(text, tmp_path, 1)
    assert fast is not None
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)


def test_many_chunks_with_growing_width(tmp_path, monkeypatch):
    """Small chunks: lines split across reads, and later lines wider than earlier ones (the
    writer re-lays its blocks out at the final width)."""
    rng = np.random.default_rng(2)
    x_narrow, narrow = random_file(rng, 150, 10)
    x_wide, wide = random_file(rng, 150, 60)
    monkeypatch.setattr(libsvm, "CHUNK_BYTES", 333)
    x, y = read_libsvm(write(tmp_path / "f.bz2", narrow + wide, compress=True), cache_dir=tmp_path / "cache")
    expected = np.zeros((300, 60), dtype=np.float32)
    expected[:150, :10], expected[150:] = x_narrow, x_wide
    d = int(np.flatnonzero(expected.any(axis=0)).max()) + 1
    np.testing.assert_array_equal(x, expected[:, :d])
    assert y.shape == (300,) and set(y.tolist()) <= {-1.0, 1.0}


def test_cache_is_reused(tmp_path, monkeypatch):
    path = write(tmp_path / "f", TEXT)
    cache = tmp_path / "cache"
    read_libsvm(path, cache_dir=cache)
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    stamp = (entry / "x.npy").stat().st_mtime_ns

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(libsvm, "_convert", refuse)
    x, y = read_libsvm(str(path), cache_dir=cache)
    assert isinstance(x, np.memmap) and x.flags.writeable  # copy-on-write: torch may wrap it
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    assert (entry / "x.npy").stat().st_mtime_ns == stamp


def test_cache_is_rebuilt_when_the_file_changes(tmp_path):
    path = write(tmp_path / "f", TEXT)
    cache = tmp_path / "cache"
    read_libsvm(path, cache_dir=cache)
    write(path, b"0 1:3\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    x, y = read_libsvm(path, cache_dir=cache)
    np.testing.assert_array_equal(x, [[3]])
    np.testing.assert_array_equal(y, [-1])
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    path = write(tmp_path / "f", TEXT)
    cache = tmp_path / "cache"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(libsvm.np, "save", disk_full)
    with pytest.raises(DataError, match=r"could not write the binary cache .*No space left on device.*free disk"):
        read_libsvm(path, cache_dir=cache)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    np.testing.assert_array_equal(read_libsvm(path, cache_dir=cache)[0], X)


@pytest.mark.parametrize(
    "bad_line, message",
    [
        (b"1 3 :0.5", "is not in LIBSVM format"),
        (b"1 3: 0.5", "is not in LIBSVM format"),
        (b"3:0.5 4:1", "is not in LIBSVM format"),
        (b"1 3:4:5", "is not in LIBSVM format"),
        (b"1 3:4 5", "is not in LIBSVM format"),
        (b"1 x:4", "is not in LIBSVM format"),
        (b"yes 1:4", "is not in LIBSVM format"),
        (b"2 1:4", "label 2 is not binary"),
        (b"1 0:4", "feature index 0 is not an integer"),
        (b"1 1.5:4", "feature index 1.5 is not an integer"),
        (b"1 2:nan", "value nan is not a finite number"),
        (b"1 2:inf", "value inf is not a finite number"),
        # finite as text, but beyond float32 (the cache's type): it would train on inf
        (b"1 2:1e40", "value 1e+40 is beyond float32's range"),
        (b"1 2:-3.5e38", "value -3.5e+38 is beyond float32's range"),
        (b"1 1:1 3:2 2:5", "feature index 2 follows index 3"),
        (b"1 1:1 3:2 3:5", "feature index 3 appears twice"),
    ],
)
def test_malformed_line_is_named(tmp_path, monkeypatch, bad_line, message):
    monkeypatch.setattr(libsvm, "CHUNK_BYTES", 64)  # the bad line sits in a later chunk
    good = b"1 1:1 2:2 3:3\n" * 20 + b"\n"
    path = write(tmp_path / "f", good + bad_line + b"\n" + good)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}, line 22(:| is not)") as err:
        read_libsvm(path, cache_dir=tmp_path / "cache")
    assert message in str(err.value)


def test_damaged_files(tmp_path):
    truncated = write(tmp_path / "t.bz2", bz2.compress(TEXT * 50)[:-20])
    with pytest.raises(DataError, match=r"cannot read .*t\.bz2 .*damaged or truncated, download it again"):
        read_libsvm(truncated, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match="holds no data lines"):
        read_libsvm(write(tmp_path / "empty", b"\n\n"), cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"cannot read the LIBSVM file .*missing"):
        read_libsvm(tmp_path / "missing", cache_dir=tmp_path / "cache")


def cache_bytes(cache: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0


@pytest.mark.parametrize("compress", [False, True])
def test_a_file_cut_in_the_middle_of_a_line_is_refused_with_its_line_number(tmp_path, compress):
    rows = b"1 1:0.5 2:0.25 3:1\n" * 5
    cut = write(tmp_path / "cut", rows + b"0 1:0.5 2:0.", compress=compress)  # an interrupted copy
    with pytest.raises(DataError) as err:
        read_libsvm(cut, cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"{cut}, line 6: the file ends in the middle of this line") and "\n" not in message
    assert "download it again" in message
    # mid-token too: a torn pair is not reported as a format error of the data
    with pytest.raises(DataError, match=r"line 6: the file ends in the middle of this line"):
        read_libsvm(write(tmp_path / "torn", rows + b"0 1:0.5 2", compress=compress), cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("compress", [False, True])
def test_a_file_without_its_final_newline_is_refused_even_when_dense(tmp_path, compress):
    # a dense file (every line has the same features, like epsilon) cut inside its last value
    # looks complete: '1 1:5 2:6' may have been '1 1:5 2:6.25'; only the line end tells
    for text, line in ((b"1 1:1 2:2\n0 1:3 2:4\n1 1:5 2:6", 3), (b"1 1:1 5:2\n0 2:3\n1 3:5", 3), (b"1 1:1", 1)):
        path = write(tmp_path / f"f{line}{len(text)}", text, compress=compress)
        with pytest.raises(DataError) as err:
            read_libsvm(path, cache_dir=tmp_path / "cache")
        message = str(err.value)
        assert message.startswith(f"{path}, line {line}: the file ends in the middle of this line"), message
        assert "end the file with a newline" in message and "\n" not in message
    np.testing.assert_array_equal(
        read_libsvm(write(tmp_path / "g", b"1 1:1 2:2\n0 1:3 2:4\n"), cache_dir=tmp_path / "cache")[0],
        [[1, 2], [3, 4]])
    # blanks after the last line end are no cut line
    np.testing.assert_array_equal(
        read_libsvm(write(tmp_path / "h", b"1 1:1 2:2\n \t"), cache_dir=tmp_path / "cache")[0], [[1, 2]])


def test_float32_extremes_that_stay_finite_are_read(tmp_path):
    text = b"1 1:3.4e38 2:-3.4e38 3:1e-50\n"  # the largest float32 magnitudes, and an underflow to 0
    x, _ = read_libsvm(write(tmp_path / "f", text), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(x, np.array([[3.4e38, -3.4e38, 0]], dtype=np.float32))
    assert np.isfinite(x).all()


def test_a_cache_built_by_the_older_rules_is_checked_again(tmp_path, monkeypatch):
    """A cache entry from a version that let inf through is rebuilt, so the new checks apply."""
    path = write(tmp_path / "f", b"1 1:1e40\n")
    monkeypatch.setattr(libsvm, "_CACHE_VERSION", 1)
    monkeypatch.setattr(libsvm, "validate", lambda *args: None)
    assert np.isinf(read_libsvm(path, cache_dir=tmp_path / "cache")[0]).all()
    monkeypatch.undo()
    with pytest.raises(DataError, match=r"line 1: value 1e\+40 is beyond float32's range"):
        read_libsvm(path, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("index", ["2000000000", "100000000"])
def test_a_width_the_file_cannot_justify_is_refused_in_one_line(tmp_path, index):
    path = write(tmp_path / "f", b"+1 1:0.5 " + index.encode() + b":1\n")  # 21 or 22 bytes
    with pytest.raises(DataError) as err:
        read_libsvm(path, cache_dir=tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"{path}, line 1: feature index {index} would make") and "\n" not in message
    assert "renumber" in message
    assert cache_bytes(tmp_path / "cache") < 1 << 20  # no 400 MB (or 8 GB) cache was written


def test_a_sparse_but_modest_width_is_still_read(tmp_path):
    x, _ = read_libsvm(write(tmp_path / "f", b"1 1:1\n0 20000:2\n"), cache_dir=tmp_path / "cache")
    assert x.shape == (2, 20000) and x[1, 19999] == 2


# --- data sets -----------------------------------------------------------------------------


def test_dataset_pair_shares_width(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "data"))
    folder = tmp_path / "a9a"
    folder.mkdir()
    write(folder / "a9a", b"1 1:1 6:2\n0 2:3\n")
    write(folder / "a9a.t.bz2", b"-1 3:4\n", compress=True)
    write(folder / "README", b"not data")
    train, test = load_libsvm_dataset(folder, name="a9a")
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.float32
    assert torch.equal(train.x, torch.tensor([[1, 0, 0, 0, 0, 2], [0, 3, 0, 0, 0, 0]], dtype=torch.float32))
    assert torch.equal(test.x, torch.tensor([[0, 0, 4, 0, 0, 0]], dtype=torch.float32))
    assert train.y.tolist() == [1, -1] and test.y.tolist() == [-1]
    assert (tmp_path / "data" / "libsvm-cache").is_dir()  # the default cache folder


def test_pair_discovery(tmp_path):
    write(tmp_path / "epsilon_normalized.bz2", b"")
    write(tmp_path / "epsilon_normalized.t", b"")
    write(tmp_path / "other", b"")
    write(tmp_path / "other.t", b"")
    assert find_pair(tmp_path) == (tmp_path / "epsilon_normalized.bz2", tmp_path / "epsilon_normalized.t")
    with pytest.raises(DataError, match=r"several LIBSVM pairs \(epsilon_normalized.bz2, other\) and none named rcv1"):
        find_pair(tmp_path, "rcv1")
    (tmp_path / "other.t").unlink()
    assert find_pair(tmp_path, "rcv1") == (tmp_path / "epsilon_normalized.bz2", tmp_path / "epsilon_normalized.t")
    write(tmp_path / "epsilon_normalized", b"")  # the decompressed file wins over the .bz2
    assert find_pair(tmp_path)[0] == tmp_path / "epsilon_normalized"
    (tmp_path / "epsilon_normalized.t").unlink()
    with pytest.raises(DataError) as err:
        find_pair(tmp_path)
    assert str(err.value) == (
        f"no LIBSVM pair (a training file F and its test file F.t, each optionally .bz2) in {tmp_path} "
        "(found: epsilon_normalized, epsilon_normalized.bz2, other); "
        "put epsilon_normalized[.bz2] and epsilon_normalized.t[.bz2] there"
    )
    with pytest.raises(DataError, match=r"the data folder .*nowhere does not exist"):
        find_pair(tmp_path / "nowhere")


def test_epsilon_offline_download_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path))
    monkeypatch.setattr(libsvm, "EPSILON_BASE_URL", "http://127.0.0.1:9/")
    with pytest.raises(DataError) as err:
        load_libsvm_dataset()
    message = str(err.value)
    assert message.startswith("could not download epsilon (")
    assert message.endswith(
        "); put epsilon_normalized.bz2 and epsilon_normalized.t.bz2 (or their decompressed versions) "
        f"from http://127.0.0.1:9/ in {tmp_path / 'epsilon'} or pass --data-dir DIR"
    )
    assert "\n" not in message
    assert sorted(p.name for p in (tmp_path / "epsilon").iterdir()) == [".lock"]  # no partial file
    with pytest.raises(DataError, match=r"no LIBSVM pair .* \(found: nothing\); put epsilon_normalized"):
        load_libsvm_dataset(download=False)


def test_epsilon_in_default_root_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path))
    monkeypatch.setattr(libsvm, "EPSILON_BASE_URL", "http://127.0.0.1:9/")
    folder = tmp_path / "epsilon"
    folder.mkdir()
    write(folder / "epsilon_normalized.bz2", b"1 1:0.25 2:-0.5\n", compress=True)
    write(folder / "epsilon_normalized.t.bz2", b"-1 1:0.75 2:1\n", compress=True)
    train, test = load_libsvm_dataset()
    assert train.x.tolist() == [[0.25, -0.5]] and test.x.tolist() == [[0.75, 1.0]]
    assert train.y.tolist() == [1.0] and test.y.tolist() == [-1.0]


# --- through the command line --------------------------------------------------------------


@pytest.mark.parametrize("train, line, problem", [
    (b"1 1:0.5 2:1\n0 1:1e40 2:1\n", 2, "value 1e+40 is beyond float32's range"),
    (b"1 1:0.5 2:1\n0 2:1 1:1\n", 2, "feature index 1 follows index 2"),
    (b"1 1:0.5 2:1\n0 1:0.25 2:0.7", 2, "the file ends in the middle of this line"),
])
def test_bad_data_stops_a_task2a_run_in_one_line_before_any_worker(tmp_path, train, line, problem):
    from mlbench.results.store import RunStore
    from tests.helpers import mlbench

    folder = tmp_path / "pair"
    folder.mkdir()
    write(folder / "bad", train)
    write(folder / "bad.t", b"1 1:0.5 2:1\n")
    proc = mlbench("run", "task2a", "2", "--data-dir", str(folder), "--max-steps", "2")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert lines[0].startswith(f"Error: {folder / 'bad'}, line {line}: {problem}"), lines[0]
    assert RunStore().list() == []


def test_the_data_cache_is_mlbench_data_then_xdg_cache_home_then_the_home_cache(tmp_path, monkeypatch):
    from mlbench.tasks.data.download import default_data_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "own"))
    assert default_data_root() == tmp_path / "own"
    monkeypatch.delenv("MLBENCH_DATA")
    assert default_data_root() == tmp_path / "xdg" / "mlbench" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the XDG specification
    assert default_data_root() == tmp_path / "home" / ".cache" / "mlbench" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_data_root() == tmp_path / "home" / ".cache" / "mlbench" / "data"


def test_a_run_converts_its_libsvm_files_into_the_xdg_cache(libsvm_dir, tmp_path, monkeypatch):
    from tests.helpers import mlbench

    monkeypatch.delenv("MLBENCH_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # never the user's cache, even when this fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    proc = mlbench("run", "task2a", "1", "--data-dir", str(libsvm_dir), "--max-steps", "2", "--log-every", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cache = tmp_path / "xdg" / "mlbench" / "data" / "libsvm-cache"
    # one converted entry per file of the pair, named for it
    assert sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir() if p.is_dir()) == ["small", "small.t"]
