"""A text corpus cut into fixed shards, and per-shard parquet output that can be resumed.

Ray-free (numpy + pyarrow), so planning, reading and writing are testable alone.

Input: ``.jsonl`` (one JSON object per line) or ``.parquet`` with a text and an id field.
For JSONL, shard k holds lines ``[k * shard_rows, (k + 1) * shard_rows)`` (blank lines
are skipped but keep their number). For parquet, a shard is a run of whole row groups
holding at least ``shard_rows`` rows (or one larger group): cutting inside a group would
decode the whole group once per shard. The cut depends only on the input and
``shard_rows``, so a second run makes the same shards and ``resume`` can skip the
finished ones.

Output folder (readable as one dataset: pyarrow and pandas skip names starting with
``_`` or ``.``)::

    OUT/part-00000.parquet    columns id, embedding (list<float32>), input row order
    OUT/_done/part-00000.json marker: written after the part, names its plan and rows
    OUT/_manifest.json        the plan (input, model, fields, shards) of this output

A shard counts as finished only when its marker names the current plan and the part
file beside it has the marker's size and row count; parts and markers are each
written to a temporary name and moved into place with ``os.replace``.
"""
from __future__ import annotations

import array
import bisect
import hashlib
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.checks import brief, check_int, json_object
from ..core.fsutil import staged, write_atomic
from ..core.errors import InputError, require

FORMAT = 1
INPUT_KINDS = {".jsonl": "jsonl", ".parquet": "parquet"}
MANIFEST = "_manifest.json"
DONE_DIR = "_done"
MAX_SHARD_ROWS = 10_000  # default cap: part files of a few MB, progress every shard
MIN_SHARD_ROWS = 1024  # default floor: each shard is sorted by length on its own, and a
# small one pads more (measured: 256-row shards ran ~25 % slower than one sorted corpus)


def pyarrow():
    """(pyarrow, pyarrow.parquet), or MissingExtraError naming the extra."""
    pa = require("ortformer batch", "ray", "pyarrow", "pyarrow.parquet")
    return pa, pa.parquet


@dataclass(frozen=True)
class Shard:
    """Input rows [start, stop); for JSONL also the byte range [offset, end) of those lines.

    rows: how many records the shard holds (JSONL blank lines are not records)."""

    index: int
    start: int
    stop: int
    rows: int
    offset: int = 0
    end: int = 0

    @property
    def part_name(self) -> str:
        return f"part-{self.index:05d}.parquet"


@dataclass(frozen=True)
class Plan:
    """Everything that decides the output's content; ``plan_id`` is its digest."""

    input: dict[str, Any]  # path, kind, size, mtime_ns
    model: dict[str, Any]  # path, size, mtime_ns, source, tokenizer size/mtime
    text_field: str
    id_field: str
    id_type: str  # int64 or string: one type for every shard, decided at planning
    shard_rows: int
    shards: tuple[Shard, ...] = field(default=())

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def plan_id(self) -> str:
        return hashlib.sha256(json.dumps(self._body(), sort_keys=True).encode()).hexdigest()[:16]

    def _body(self) -> dict[str, Any]:
        data = asdict(self)  # nested Shards become dicts too
        return {"format": FORMAT, **data, "shards": [dict(s) for s in data["shards"]]}

    def to_dict(self) -> dict[str, Any]:
        return {**self._body(), "plan_id": self.plan_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        data = {k: v for k, v in data.items() if k not in ("format", "plan_id")}
        data["shards"] = tuple(Shard(**s) for s in data["shards"])
        return cls(**data)


def file_stamp(path: Path) -> dict[str, Any]:
    """What identifies a file's version cheaply: its absolute path, size and mtime."""
    stat = path.stat()
    return {"path": str(path.absolute()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def input_kind(path: Path) -> str:
    kind = INPUT_KINDS.get(path.suffix.lower())
    if kind is None:
        raise InputError(f"input {path} must be a .jsonl or .parquet file (got suffix {path.suffix!r})")
    if not path.is_file():
        raise InputError(f"input {path}: no such file")
    return kind


def default_shard_rows(rows: int) -> int:
    """About 64 shards (enough to spread over actors), each 1,024..10,000 rows."""
    return min(MAX_SHARD_ROWS, max(MIN_SHARD_ROWS, math.ceil(rows / 64)))


def plan_corpus(path: Path, model: dict[str, Any], text_field: str, id_field: str,
                shard_rows: int | None) -> Plan:
    """Cut ``path`` into shards. Reads every JSONL line once (no JSON parsing beyond the
    first record), or only the parquet footer and schema."""
    kind = input_kind(path)
    if shard_rows is not None:
        check_int("shard_rows", shard_rows)
    stamp = {**file_stamp(path), "kind": kind}
    if kind == "jsonl":
        offsets, blank, id_type = _scan_jsonl(path, text_field, id_field)
        lines = len(offsets) - 1
        size = shard_rows or default_shard_rows(lines - len(blank))
        shards = []
        for index, start in enumerate(range(0, lines, size)):
            stop = min(start + size, lines)
            rows = stop - start - (bisect.bisect_left(blank, stop) - bisect.bisect_left(blank, start))
            shards.append(Shard(index, start, stop, rows, offsets[start], offsets[stop]))
    else:
        groups, id_type = _scan_parquet(path, text_field, id_field)
        size = shard_rows or default_shard_rows(sum(groups))
        shards, start, stop = [], 0, 0
        for n in groups:  # whole row groups, merged until a shard holds >= size rows
            stop += n
            if stop - start >= size:
                shards.append(Shard(len(shards), start, stop, stop - start))
                start = stop
        if stop > start:
            shards.append(Shard(len(shards), start, stop, stop - start))
    if not shards:  # an empty input still gets one (empty) part file: readers see the id and embedding columns
        shards.append(Shard(0, 0, 0, 0, *((offsets[0], offsets[0]) if kind == "jsonl" else ())))
    return Plan(stamp, model, text_field, id_field, id_type, size, tuple(shards))


def _scan_jsonl(path: Path, text_field: str, id_field: str) -> tuple[array.array, list[int], str]:
    """Byte offset of every line start (plus the file end), blank line numbers, id type.

    Only the first record is parsed: its id decides the id type of the whole output,
    and a missing text field there is most likely a wrong --text-field."""
    offsets = array.array("q", [0])  # 8 bytes a line, not a Python int each
    blank, id_type, position = [], None, 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle):
            position += len(line)
            offsets.append(position)
            if not line.strip():
                blank.append(number)
            elif id_type is None:
                record = _parse_line(path, number, line)
                if text_field not in record:
                    raise InputError(f"{path}:{number + 1}: the first record has no field {text_field!r} "
                                     f"(fields: {sorted(record)}); name the text field with text_field (--text-field)")
                id_type = "string" if isinstance(record.get(id_field), str) else "int64"
    return offsets, blank, id_type or "int64"


def _scan_parquet(path: Path, text_field: str, id_field: str) -> tuple[list[int], str]:
    """Rows per row group, id type."""
    pa, pq = pyarrow()
    try:
        meta = pq.ParquetFile(path)
    except Exception as exc:  # ArrowInvalid and friends: not parquet, truncated, ...
        raise InputError(f"input {path}: not a readable parquet file: {exc}") from None
    schema = meta.schema_arrow
    groups = [meta.metadata.row_group(g).num_rows for g in range(meta.metadata.num_row_groups)]
    if text_field not in schema.names:
        raise InputError(f"input {path} has no column {text_field!r} (columns: {schema.names}); "
                         "name the text column with text_field (--text-field)")
    if id_field not in schema.names:
        return groups, "int64"  # ids are the row numbers
    id_arrow = schema.field(id_field).type
    if pa.types.is_integer(id_arrow):
        return groups, "int64"
    if pa.types.is_string(id_arrow) or pa.types.is_large_string(id_arrow):
        return groups, "string"
    raise InputError(f"input {path}: column {id_field!r} has type {id_arrow}; ids must be integers or strings")


def _parse_line(path: Path, number: int, line: bytes) -> dict:
    return json_object(line, f"{path}:{number + 1}: the line", InputError)


# ----------------------------------------------------------------------- reading


def read_shard(plan: Plan, shard: Shard) -> tuple[list, list[str]]:
    """(ids, texts) of one shard in input order; rows without an id get their row number
    (line number for JSONL, counted from 0). Raises InputError naming file and row."""
    path = Path(plan.input["path"])
    if plan.input["kind"] == "jsonl":
        ids, texts = _read_jsonl(path, plan, shard)
    else:
        ids, texts = _read_parquet(path, plan, shard)
    if len(ids) != shard.rows:
        raise InputError(f"input {path} changed while it was being embedded: shard {shard.index} "
                         f"has {len(ids)} rows, {shard.rows} were planned; start a new output")
    return ids, texts


def _check_id(path: Path, where: str, value, row: int, id_type: str):
    if value is None:
        return row if id_type == "int64" else str(row)
    if id_type == "int64" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if id_type == "string" and isinstance(value, str):
        return value
    want = "an integer" if id_type == "int64" else "a string"
    raise InputError(f"{path}:{where}: id {value!r} must be {want} like the first record's id "
                     "(or absent, to use the row number)")


def _check_text(path: Path, where: str, field_name: str, value) -> str:
    if not isinstance(value, str):
        got = "missing" if value is None else f"{type(value).__name__} {brief(value, 40)}"
        raise InputError(f"{path}:{where}: field {field_name!r} is {got}; every record needs a text string")
    return value


def _read_jsonl(path: Path, plan: Plan, shard: Shard) -> tuple[list, list[str]]:
    ids, texts = [], []
    with open(path, "rb") as handle:
        handle.seek(shard.offset)
        block = handle.read(shard.end - shard.offset)
    # split like the planning scan did (file iteration: on b"\n" only), so numbers agree
    for number, line in enumerate(io.BytesIO(block), start=shard.start):
        if not line.strip():
            continue
        record = _parse_line(path, number, line)
        where = str(number + 1)
        ids.append(_check_id(path, where, record.get(plan.id_field), number, plan.id_type))
        texts.append(_check_text(path, where, plan.text_field, record.get(plan.text_field)))
    return ids, texts


def _read_parquet(path: Path, plan: Plan, shard: Shard) -> tuple[list, list[str]]:
    _, pq = pyarrow()
    handle = pq.ParquetFile(path)
    columns = [plan.text_field] + ([plan.id_field] if plan.id_field in handle.schema_arrow.names else [])
    # the row groups making up [start, stop) (shards are cut at group boundaries)
    groups, row = [], 0
    for g in range(handle.metadata.num_row_groups):
        n = handle.metadata.row_group(g).num_rows
        if shard.start <= row and row + n <= shard.stop:
            groups.append(g)
        row += n
    table = handle.read_row_groups(groups, columns=columns)
    texts_raw = table.column(plan.text_field).to_pylist()
    ids_raw = table.column(plan.id_field).to_pylist() if plan.id_field in columns else [None] * len(texts_raw)
    ids, texts = [], []
    for i, (value, text) in enumerate(zip(ids_raw, texts_raw), start=shard.start):
        where = f"row {i}"
        ids.append(_check_id(path, where, value, i, plan.id_type))
        texts.append(_check_text(path, where, plan.text_field, text))
    return ids, texts


# ----------------------------------------------------------------------- writing


def write_shard(out: Path, plan: Plan, shard: Shard, ids: list, embeddings: np.ndarray, seconds: float) -> dict:
    """Write the part file, then its marker, each atomically; return the marker.

    embeddings: (rows, F) float32, row i belonging to ids[i]."""
    pa, pq = pyarrow()
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if embeddings.ndim != 2 or len(embeddings) != len(ids):
        raise ValueError(f"embeddings of shape {embeddings.shape} do not match {len(ids)} ids")
    rows, width = embeddings.shape
    if rows * width >= 2**31:  # list<float32> has int32 offsets
        raise ValueError(f"a shard of {rows} x {width} values is too large for one part file; use fewer shard_rows")
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    vectors = pa.ListArray.from_arrays(offsets, pa.array(embeddings.reshape(-1)))  # zero-copy
    table = pa.table({"id": pa.array(ids, type=pa.int64() if plan.id_type == "int64" else pa.string()),
                      "embedding": vectors})
    part = out / shard.part_name
    with staged(part) as tmp:  # the bytes are on disk before the name points at them
        pq.write_table(table, tmp)
    marker = {"plan_id": plan.plan_id, "shard": shard.index, "rows": rows, "dim": width,
              "bytes": part.stat().st_size, "seconds": round(seconds, 4), "finished": time.time()}
    write_json(out / DONE_DIR / f"{part.stem}.json", marker)
    return marker


def finished(out: Path, plan: Plan) -> dict[int, dict]:
    """{shard index: marker} for the shards whose part file is complete for this plan."""
    _, pq = pyarrow()
    done = {}
    for shard in plan.shards:
        marker = read_json(out / DONE_DIR / f"{Path(shard.part_name).stem}.json")
        part = out / shard.part_name
        if not marker or marker.get("plan_id") != plan.plan_id or marker.get("rows") != shard.rows:
            continue
        try:
            if part.stat().st_size != marker.get("bytes") or pq.ParquetFile(part).metadata.num_rows != shard.rows:
                continue
        except Exception:  # missing or unreadable part: redo the shard
            continue
        done[shard.index] = marker
    return done


def remove_stale(out: Path) -> None:
    """Temporary files a killed run left behind (never anything else)."""
    for folder in (out, out / DONE_DIR):
        for stale in folder.glob(".*.tmp") if folder.is_dir() else ():
            stale.unlink(missing_ok=True)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def read_json(path: Path) -> dict | None:
    try:
        return json_object(path.read_text(), str(path))
    except (OSError, ValueError):  # unreadable, not JSON or not an object: no record
        return None
