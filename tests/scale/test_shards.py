"""Corpus planning, reading and shard output without Ray (fast)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from ortformer.core.errors import InputError, MissingExtraError
from ortformer.scale import shards as sh

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
MODEL = {"path": "m.onnx", "size": 1, "mtime_ns": 1, "source": "s", "tokenizer": {}}


def write_jsonl(path, records):
    with open(path, "w") as handle:
        for record in records:
            handle.write(record if isinstance(record, str) else json.dumps(record))
            handle.write("\n")
    return path


def test_jsonl_plan_reads_every_record_once_and_numbers_missing_ids(tmp_path):
    records = [{"id": i * 10, "text": f"t{i}"} for i in range(10)]
    records[3] = {"text": "no id"}  # gets its line number, 3
    lines = records[:5] + ["", "   "] + records[5:]  # blank lines keep their numbers
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    plan = sh.plan_corpus(path, MODEL, "text", "id", shard_rows=4)
    assert plan.id_type == "int64" and plan.rows == 10
    assert [(s.start, s.stop, s.rows) for s in plan.shards] == [(0, 4, 4), (4, 8, 2), (8, 12, 4)]
    ids, texts = zip(*[pair for s in plan.shards for pair in zip(*sh.read_shard(plan, s))])
    assert list(ids) == [0, 10, 20, 3, 40, 50, 60, 70, 80, 90]
    assert list(texts) == [r["text"] for r in records]


def test_jsonl_string_ids_and_type_mixing(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "x"}, {"text": "y"}, {"id": 7, "text": "z"}])
    plan = sh.plan_corpus(path, MODEL, "text", "id", shard_rows=2)
    assert plan.id_type == "string"
    assert sh.read_shard(plan, plan.shards[0]) == (["a", "1"], ["x", "y"])
    with pytest.raises(InputError, match=r"in.jsonl:3: id 7 must be a string"):
        sh.read_shard(plan, plan.shards[1])


@pytest.mark.parametrize("line, match", [('{"text": 5}', r":2: field 'text' is int 5"),
                                         ('{"id": 1}', r":2: field 'text' is missing"),
                                         ('[1, 2]', r":2: the line must be a JSON object, got list"),
                                         ('{"text": "x"', r":2: the line is not valid JSON")])
def test_bad_jsonl_rows_name_file_and_line(tmp_path, line, match):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, line])
    plan = sh.plan_corpus(path, MODEL, "text", "id", None)
    with pytest.raises(InputError, match=match):
        sh.read_shard(plan, plan.shards[0])


def test_parquet_shards_follow_row_groups_and_ids_default_to_row_numbers(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"body": [f"text {i}" for i in range(25)]}), path, row_group_size=5)
    plan = sh.plan_corpus(path, MODEL, "body", "id", shard_rows=8)
    # whole groups of 5, merged until >= 8 rows: 10, 10, 5
    assert [(s.start, s.stop) for s in plan.shards] == [(0, 10), (10, 20), (20, 25)]
    ids, texts = sh.read_shard(plan, plan.shards[1])
    assert ids == list(range(10, 20)) and texts[0] == "text 10"
    with pytest.raises(InputError, match="no column 'text'"):
        sh.plan_corpus(path, MODEL, "text", "id", None)


def test_parquet_id_types(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", None], "text": ["x", "y"]}), path)
    plan = sh.plan_corpus(path, MODEL, "text", "id", None)
    assert plan.id_type == "string" and sh.read_shard(plan, plan.shards[0]) == (["a", "1"], ["x", "y"])
    pq.write_table(pa.table({"id": [1.5], "text": ["x"]}), path)
    with pytest.raises(InputError, match="ids must be integers or strings"):
        sh.plan_corpus(path, MODEL, "text", "id", None)


@pytest.mark.parametrize("name, match", [("in.csv", "must be a .jsonl or .parquet"), ("missing.jsonl", "no such file")])
def test_bad_input_paths(tmp_path, name, match):
    if name.endswith(".csv"):
        (tmp_path / name).write_text("id,text\n")
    with pytest.raises(InputError, match=match):
        sh.plan_corpus(tmp_path / name, MODEL, "text", "id", None)


def test_plan_id_tracks_everything_that_changes_the_output(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}] * 10)
    plan = sh.plan_corpus(path, MODEL, "text", "id", 4)
    assert sh.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.plan_id == sh.plan_corpus(path, MODEL, "text", "id", 4).plan_id
    assert plan.plan_id != sh.plan_corpus(path, MODEL, "text", "id", 5).plan_id
    assert plan.plan_id != sh.plan_corpus(path, {**MODEL, "size": 2}, "text", "id", 4).plan_id
    write_jsonl(path, [{"text": "a"}] * 11)
    assert plan.plan_id != sh.plan_corpus(path, MODEL, "text", "id", 4).plan_id


def test_written_shards_count_as_finished_only_when_intact(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": "a"} for i in range(6)])
    plan = sh.plan_corpus(path, MODEL, "text", "id", 3)
    out = tmp_path / "out"
    out.mkdir()
    for shard in plan.shards:
        ids, _ = sh.read_shard(plan, shard)
        sh.write_shard(out, plan, shard, ids, np.full((len(ids), 4), shard.index, np.float32), 0.1)
    assert sorted(sh.finished(out, plan)) == [0, 1]
    table = pq.read_table(out)  # the folder reads as one dataset: markers and manifest are skipped
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(6)]
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    assert np.array(table.column("embedding").to_pylist()).shape == (6, 4)
    (out / "part-00001.parquet").write_bytes(b"truncated")  # a part not matching its marker
    assert sorted(sh.finished(out, plan)) == [0]
    (out / "_done" / "part-00000.json").unlink()  # a part without its marker
    assert sh.finished(out, plan) == {}
    (out / ".part-00000.parquet.x.tmp").write_bytes(b"")
    sh.remove_stale(out)
    assert not list(out.glob(".*.tmp")) and (out / "part-00000.parquet").exists()


def test_missing_ray_names_the_extra(monkeypatch, tmp_path):
    from ortformer.scale import embed_corpus

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingExtraError, match=r"ortformer batch needs the 'ray' extra \(ray is not installed\)"):
        embed_corpus(tmp_path / "m.onnx", tmp_path / "in.jsonl", tmp_path / "out")


@pytest.mark.parametrize("kwargs, match", [({"num_actors": 0}, "num_actors"), ({"batch_size": 1.5}, "batch_size"),
                                           ({"provider": "tpu"}, "choose one of cpu, cuda"),
                                           ({"id_field": "text"}, "two different fields")])
def test_bad_arguments_are_refused_before_ray_starts(tmp_path, kwargs, match):
    from ortformer.scale import embed_corpus

    with pytest.raises(InputError, match=match):
        embed_corpus(tmp_path / "m.onnx", tmp_path / "in.jsonl", tmp_path / "out", **kwargs)


def test_wrong_text_field_is_caught_while_planning(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", ["", {"id": 1, "body": "x"}])
    with pytest.raises(InputError, match=r"in.jsonl:2: the first record has no field 'text' \(fields: \['body', 'id'\]\)"):
        sh.plan_corpus(path, MODEL, "text", "id", None)
