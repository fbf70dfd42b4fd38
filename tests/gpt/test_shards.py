"""Task 5a's token shards (llm.c's format), the stream the steps walk, each worker's part of a
step, and FineWeb's download from a stand-in Hub on 127.0.0.1 (listing, SHA-256, resume)."""

from __future__ import annotations

import numpy as np
import pytest

from mlbench.errors import DataError
from mlbench.tasks.task5a import fineweb
from mlbench.tasks.task5a.shards import (HEADER_BYTES, MAGIC, ShardError, TokenStream, load_tokens, read_header,
                                         worker_sequences, write_shard)
from tests.gpt.hub import Hub


def test_a_shard_is_llm_cs_header_then_uint16_tokens(tmp_path):
    path = tmp_path / "fineweb_train_000001.bin"
    write_shard(path, [5, 50256, 0, 65535])
    raw = path.read_bytes()
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert (header[0], header[1], header[2]) == (MAGIC, 1, 4) and not header[3:].any()
    assert np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist() == [5, 50256, 0, 65535]
    assert load_tokens(path).tolist() == [5, 50256, 0, 65535]


@pytest.mark.parametrize(("damage", "says"), [
    (lambda raw: raw[:100], "shorter than the 1,024-byte header"),
    (lambda raw: b"\0" * 4 + raw[4:], "magic 0, expected 20240520"),
    (lambda raw: raw[:-2], "the header counts 4 tokens (1,032 bytes) but the file has 1,030 bytes"),
])
def test_a_damaged_shard_is_one_line_naming_it(tmp_path, damage, says):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3, 4])
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ShardError) as refused:
        read_header(path)
    assert says in str(refused.value) and str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_the_stream_reads_across_shards_and_wraps_at_its_end(tmp_path):
    write_shard(tmp_path / "a.bin", range(0, 5))
    write_shard(tmp_path / "b.bin", range(5, 8))
    stream = TokenStream([tmp_path / "a.bin", tmp_path / "b.bin"])
    assert stream.total == 8
    assert stream.read(3, 4).tolist() == [3, 4, 5, 6]
    assert stream.read(6, 5).tolist() == [6, 7, 0, 1, 2]
    assert stream.read(17, 3).tolist() == [1, 2, 3]


@pytest.mark.parametrize(("workers", "micro"), [(1, 8), (2, 4), (4, 2), (2, 1)])
def test_the_workers_micro_batches_together_are_the_global_batch_once(workers, micro):
    global_batch = 8
    accumulation = global_batch // (workers * micro)
    seen = [j for m in range(accumulation) for r in range(workers) for j in worker_sequences(m, r, workers, micro)]
    assert sorted(seen) == list(range(global_batch))


def shards(count: int, tokens: int = 300) -> dict[str, bytes]:
    """The validation shard and ``count`` train shards of FineWeb's names, as their bytes."""
    rng = np.random.default_rng(0)
    files = {}
    for name in [fineweb.VAL_NAME] + [fineweb.train_name(i) for i in range(1, count + 1)]:
        header = np.zeros(256, dtype="<i4")
        header[:3] = (MAGIC, 1, tokens)
        files[name] = header.tobytes() + rng.integers(0, 50257, tokens).astype("<u2").tobytes()
    return files


@pytest.fixture
def hub(monkeypatch):
    served = Hub(fineweb.REPO, shards(fineweb.TRAIN_SHARDS), page=40)
    monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
    yield served
    served.close()


def test_the_download_lists_the_hub_in_pages_checks_each_shard_and_keeps_the_manifest(hub, tmp_path):
    folder = fineweb.download(tmp_path / "fw", train_shards=3)
    assert hub.downloads() == [fineweb.VAL_NAME] + [fineweb.train_name(i) for i in (1, 2, 3)]
    assert sum("/tree/main" in path for path, _ in hub.log) == 3  # 104 files, 40 a page
    for name in hub.downloads():
        assert (folder / name).read_bytes() == hub.files[name]
    good, problems = fineweb.verify(folder)
    assert good == hub.downloads() and problems == []
    fineweb.download(folder, train_shards=3)  # all there: nothing fetched again, not even the listing
    assert len(hub.downloads()) == 4 and sum("/tree/main" in p for p, _ in hub.log) == 3


def test_a_shard_whose_bytes_differ_from_the_listing_is_refused_and_not_kept(hub, tmp_path):
    hub.files[fineweb.train_name(1)] = hub.files[fineweb.train_name(1)][:-2] + b"\0\0"  # listing unchanged
    with pytest.raises(DataError) as refused:
        fineweb.download(tmp_path / "fw", train_shards=1)
    assert "damaged (sha256 " in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "fw" / fineweb.train_name(1)).exists()
    assert not (tmp_path / "fw" / (fineweb.train_name(1) + ".part")).exists()


def test_an_interrupted_download_resumes_from_its_part_file(hub, tmp_path):
    folder = tmp_path / "fw"
    fineweb.download(folder, train_shards=1)
    name = fineweb.train_name(2)
    (folder / (name + ".part")).write_bytes(hub.files[name][:700])
    fineweb.download(folder, train_shards=2)
    assert (folder / name).read_bytes() == hub.files[name]
    assert (f"/datasets/{fineweb.REPO}/resolve/main/{name}", "bytes=700-") in hub.log


def test_verify_names_a_shard_changed_on_disk(hub, tmp_path):
    folder = fineweb.download(tmp_path / "fw", train_shards=2)
    path = folder / fineweb.train_name(2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    good, problems = fineweb.verify(folder)
    assert good == [fineweb.VAL_NAME, fineweb.train_name(1)]
    assert len(problems) == 1 and problems[0].startswith(fineweb.train_name(2) + ": SHA-256 ")


def test_a_hub_that_cannot_be_reached_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataError) as refused:
        fineweb.download(tmp_path / "fw", train_shards=1)
    assert str(refused.value).startswith(f"could not list the files of {fineweb.REPO}")
    assert "--data-dir" in str(refused.value)


def test_the_data_are_official_only_as_the_whole_listed_download(hub, tmp_path, monkeypatch):
    from mlbench.tasks.data.identity import data_identity

    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "root"))
    folder = fineweb.download(tmp_path / "fw", train_shards=fineweb.TRAIN_SHARDS)
    whole = data_identity("fineweb10B", str(folder))
    assert whole.official and whole.rows == {"train": 300 * fineweb.TRAIN_SHARDS, "valid": 300}
    assert len(whole.files) == 1 + fineweb.TRAIN_SHARDS
    (folder / fineweb.train_name(103)).unlink()
    part = data_identity("fineweb10B", str(folder))
    assert not part.official and part.reason == "102 of FineWeb's 103 train shards"
    own = tmp_path / "own"
    write_shard(own / "fineweb_train_000001.bin", range(100))
    write_shard(own / "fineweb_val_000000.bin", range(50))
    mine = data_identity("fineweb10B", str(own))
    assert not mine.official and mine.reason.startswith("token shards without FineWeb's manifest")
    assert mine.rows == {"train": 100, "valid": 50}
