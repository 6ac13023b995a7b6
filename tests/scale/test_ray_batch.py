"""embed_corpus on a local Ray instance: one output row per input row, embeddings equal to
Runtime.embed_texts, resume after an interrupted run. One Ray instance for the module
(starting Ray takes ~8 s on 2 cores); each pipeline run costs a few seconds of actor start-up."""
from __future__ import annotations

import json
import random
import shutil
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from ortformer.core.errors import InputError, ModelFileError, OutputError  # noqa: E402
from ortformer.runtime import Runtime  # noqa: E402
from ortformer.scale import embed_corpus  # noqa: E402

# Ray Data warns about its own deprecated settings when it copies its context: not ours to fix
pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\.data")]
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
         "matches in foggy harbours near ancient lighthouses").split()


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """embed_corpus reuses a connection the process already has (and leaves it open)."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=300 * 1024 * 1024, log_to_driver=False)
    yield
    ray.shutdown()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 50))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 texts; every 7th line has no id and gets its line number as id."""
    path = tmp_path_factory.mktemp("corpus") / "texts.jsonl"
    records = [{"text": t} if i % 7 == 3 else {"id": f"doc-{i}", "text": t} for i, t in enumerate(texts(300))]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ids = [r.get("id", str(i)) for i, r in enumerate(records)]
    return path, ids, [r["text"] for r in records]


@pytest.fixture(scope="module")
def reference(text_model, corpus):
    """What a plain single-process loop gives for the same texts."""
    return Runtime(text_model, "cpu").embed_texts(corpus[2], batch_size=16)


@pytest.fixture(scope="module")
def first_run(text_model, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "embeddings.parquet"
    calls = []
    stats = embed_corpus(text_model, corpus[0], out, num_actors=2, batch_size=16, shard_rows=64,
                         progress=lambda done, total, rate: calls.append((done, total, rate)))
    return out, stats, calls


def read_output(out) -> dict:
    table = pq.read_table(out)
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "duplicated ids in the output"
    return dict(zip(ids, np.array(table.column("embedding").to_pylist(), np.float32)))


def assert_equal_to_reference(out, corpus, reference):
    rows = read_output(out)
    assert sorted(rows) == sorted(corpus[1])  # exactly one row per input id
    got = np.stack([rows[i] for i in corpus[1]])
    assert got.shape == reference.shape
    assert np.abs(got - reference).max() <= 1e-5


def test_one_row_per_id_equal_to_runtime_embed_texts(first_run, corpus, reference):
    out, stats, calls = first_run
    assert stats["rows"] == stats["rows_embedded"] == 300
    assert (stats["shards"], stats["shards_skipped"], stats["dim"], stats["duplicate_ids"]) == (5, 0, 32, 0)
    assert stats["rows_per_s"] > 0 and stats["num_actors"] == 2
    assert_equal_to_reference(out, corpus, reference)
    assert pq.read_table(out).schema.field("embedding").type == pa.list_(pa.float32())
    assert calls[0][:2] == (0, 300) and calls[-1][:2] == (300, 300) and calls[-1][2] > 0
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_resume_redoes_only_unfinished_shards(first_run, corpus, reference, text_model, cli_group, tmp_path):
    """An interrupted run, simulated: one shard lost with its marker, one part written but its
    marker not (killed in between), one part torn, a temporary file left behind."""
    out = tmp_path / "embeddings.parquet"
    shutil.copytree(first_run[0], out)
    kept = {name: (out / name).stat().st_mtime_ns for name in ("part-00000.parquet", "part-00001.parquet")}
    (out / "part-00002.parquet").unlink()
    (out / "_done" / "part-00002.json").unlink()
    (out / "_done" / "part-00003.json").unlink()
    (out / "part-00004.parquet").write_bytes(b"torn")
    (out / ".part-00004.parquet.abc.tmp").write_bytes(b"partial")
    result = CliRunner().invoke(cli_group, ["batch", str(text_model), "--input", str(corpus[0]), "--output", str(out),
                                            "--resume", "--shard-rows", "64", "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    # shards 2, 3 (64 rows each) and 4 (the last 44) are redone; 0 and 1 are kept as they were
    assert "embedded 172 rows, 128 already done" in result.output
    assert "[300 rows, 5 shards, dim 32]" in result.output
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    assert not list(out.glob(".*.tmp"))
    assert_equal_to_reference(out, corpus, reference)


def test_existing_output_needs_resume_and_the_same_plan(first_run, corpus, text_model):
    out = first_run[0]
    with pytest.raises(OutputError, match="already exists; pass resume=True"):
        embed_corpus(text_model, corpus[0], out, shard_rows=64)
    with pytest.raises(OutputError, match="cannot resume .*shard_rows differs"):
        embed_corpus(text_model, corpus[0], out, shard_rows=32, resume=True)
    stats = embed_corpus(text_model, corpus[0], out, shard_rows=64, resume=True)  # all done: no work
    assert (stats["rows_embedded"], stats["shards_skipped"]) == (0, 5)


def test_parquet_input_without_ids_uses_row_numbers(text_model, tmp_path):
    path = tmp_path / "texts.parquet"
    corpus = texts(100, seed=1)
    pq.write_table(pa.table({"body": corpus}), path, row_group_size=40)
    stats = embed_corpus(text_model, path, tmp_path / "out", text_field="body", batch_size=8)
    assert (stats["rows"], stats["shards"]) == (100, 1)  # 100 rows are fewer than the minimum shard
    table = pq.read_table(tmp_path / "out")
    assert table.column("id").to_pylist() == list(range(100)) and table.schema.field("id").type == pa.int64()
    expected = Runtime(text_model, "cpu").embed_texts(corpus, batch_size=8)
    assert np.abs(np.array(table.column("embedding").to_pylist()) - expected).max() <= 1e-5


def test_bad_row_in_an_actor_surfaces_as_input_error(text_model, tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": t if i != 70 else None}) + "\n" for i, t in enumerate(texts(80))))
    with pytest.raises(InputError, match=r"texts.jsonl:71: field 'text' is missing"):
        embed_corpus(text_model, path, tmp_path / "out", shard_rows=40)


def test_model_must_name_a_tokenizer(text_model, corpus, tmp_path):
    import onnx

    from ortformer import contract

    model = onnx.load(str(text_model))
    del model.metadata_props[[p.key for p in model.metadata_props].index(contract.META_TOKENIZER)]
    onnx.save(model, str(tmp_path / "untokenized.onnx"))
    with pytest.raises(ModelFileError, match="names no tokenizer"):
        embed_corpus(tmp_path / "untokenized.onnx", corpus[0], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before any output or Ray work


def test_duplicate_ids_are_kept_and_reported(text_model, tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": i % 5, "text": t}) + "\n" for i, t in enumerate(texts(10))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = embed_corpus(text_model, path, tmp_path / "out")
    assert stats["duplicate_ids"] == 5 and pq.read_table(tmp_path / "out").num_rows == 10
    assert any("repeat an id" in str(w.message) for w in caught)


def test_an_empty_input_writes_an_empty_table_with_both_columns(text_model, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    stats = embed_corpus(text_model, tmp_path / "empty.jsonl", tmp_path / "out")
    assert (stats["rows"], stats["shards"], stats["dim"]) == (0, 1, Runtime(text_model, "cpu").config.sentence_size)
    table = pq.read_table(tmp_path / "out")
    assert table.num_rows == 0 and table.column_names == ["id", "embedding"]
