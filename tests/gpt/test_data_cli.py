"""`mlbench data` for task 5a: download from a stand-in Hub on 127.0.0.1, list, verify, and own
text tokenised into shards with a real tiktoken encoding (a byte-level one: GPT-2's files are
fetched from the internet, which tests do not reach)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mlbench.cli import cli
from mlbench.cli import commands  # noqa: F401  (registers the commands)
from mlbench.tasks.task5a import fineweb
from mlbench.tasks.task5a.shards import load_tokens
from mlbench.tasks.task5a.tokenize import END_OF_TEXT, tokenize
from tests.gpt.hub import Hub
from tests.gpt.test_shards import shards


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    served = Hub(fineweb.REPO, shards(fineweb.TRAIN_SHARDS), page=60)
    monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "data"))
    yield served
    served.close()


def test_download_list_and_verify_from_the_command_line(hub, tmp_path):
    done = invoke("data", "download", "fineweb10B", "--train-shards", "2")
    assert done.exit_code == 0, done.output
    folder = tmp_path / "data" / "fineweb10B"
    assert done.output.strip() == f"FineWeb-10B is in {folder}"
    listed = invoke("data", "list")
    assert f"FineWeb-10B (task 5a) in {folder}: 1 validation and 2 of 103 train shards, 900 tokens" in listed.output
    document = json.loads(invoke("data", "list", "-o", "json").output)
    assert [s["name"] for s in document["fineweb10B"]["shards"]] == [fineweb.VAL_NAME, fineweb.train_name(1),
                                                                     fineweb.train_name(2)]
    assert all(s["listed"] for s in document["fineweb10B"]["shards"])
    checked = invoke("data", "verify", "fineweb10B")
    assert checked.exit_code == 0 and "3 of 104 files of FineWeb-10B match its listing" in checked.output
    path = folder / fineweb.train_name(1)
    path.write_bytes(path.read_bytes()[:-2] + b"\1\1")
    damaged = invoke("data", "verify", "fineweb10B")
    assert damaged.exit_code == 1 and "; 1 differ" in damaged.output
    assert damaged.output.startswith(fineweb.train_name(1) + ": SHA-256 ")


def test_an_option_of_fineweb_given_for_another_data_set_is_a_usage_error(hub):
    refused = CliRunner().invoke(cli, ["data", "download", "cifar10", "--train-shards", "2"])
    assert refused.exit_code == 2 and "apply to fineweb10B, not to cifar10" in refused.output


def byte_encoding():
    """A real tiktoken Encoding: one token per byte, and GPT-2's end-of-text id."""
    tiktoken = pytest.importorskip("tiktoken")
    return tiktoken.Encoding("bytes", pat_str=r"[\s\S]", mergeable_ranks={bytes([b]): b for b in range(256)},
                             special_tokens={"<|endoftext|>": END_OF_TEXT})


def test_own_text_becomes_a_validation_shard_and_train_shards_each_document_after_end_of_text(tmp_path):
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "ab"}) + "\n\n" + json.dumps({"text": "xyz"}) + "\n",
                                      encoding="utf-8")
    written = tokenize([tmp_path / "a.txt", tmp_path / "b.jsonl"], tmp_path / "out", val_tokens=4, shard_tokens=3,
                       encoding=byte_encoding())
    stream = [END_OF_TEXT, *b"hello", END_OF_TEXT, *b"ab", END_OF_TEXT, *b"xyz"]
    assert [p.name for p in written] == [fineweb.VAL_NAME] + [fineweb.train_name(i) for i in (1, 2, 3)]
    assert np.concatenate([load_tokens(p) for p in written]).tolist() == stream
    assert [len(load_tokens(p)) for p in written] == [4, 3, 3, 3]


def test_text_too_short_for_the_validation_shard_is_one_line(tmp_path):
    from mlbench.errors import DataError

    (tmp_path / "a.txt").write_text("hi", encoding="utf-8")
    with pytest.raises(DataError, match=r"the text holds 3 tokens, not more than the 10 of the validation shard"):
        tokenize([tmp_path / "a.txt"], tmp_path / "out", val_tokens=10, shard_tokens=5, encoding=byte_encoding())
    (tmp_path / "bad.jsonl").write_text("{\"txt\": 1}\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl, line 1: not a JSON object with a \"text\" field"):
        tokenize([tmp_path / "bad.jsonl"], tmp_path / "out", val_tokens=1, shard_tokens=5, encoding=byte_encoding())
