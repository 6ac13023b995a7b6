"""Embed a text corpus with Ray: an actor pool, one onnxruntime session per actor.

    stats = embed_corpus("model.onnx", "texts.jsonl", "embeddings.parquet", num_actors=2)

Needs the optional ``ray`` extra (``pip install '.[ray]'`` in a clone): ray[data] and pyarrow,
imported on the first call, so importing this module never fails.

How the work is cut: the driver plans fixed shards of the input (``shards.py``) and
hands Ray Data one row per unfinished shard. ``map_batches`` runs them on a pool of
``num_actors`` actors; each actor opens ONE ``Runtime`` in ``__init__`` and, per
shard, reads its rows and embeds them in one ``Runtime.embed_texts`` call, which
tokenizes, sorts by token length (so each model batch of ``batch_size`` pads little)
and returns the rows in input order; then it writes the shard's part file and
marker atomically. The shards are not read with
``ray.data.read_json``/``read_parquet`` because their blocks are neither stable
between runs nor tied to row numbers, and both are what resume and row-number ids
need. The model, input and output paths must be readable/writable from every node
(a shared filesystem) when ``ray_address`` names a cluster.
"""
from __future__ import annotations

import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import contract
from ..core.checks import check_int
from ..config import SENTENCE_POOLINGS
from ..core.errors import InputError, ModelFileError, OrtformerError, OutputError, require
from ..core.cpus import available_cpus
from .shards import (MANIFEST, Plan, file_stamp, finished, plan_corpus, pyarrow, read_json, read_shard,
                     remove_stale, write_json, write_shard)

# no "auto" here: each actor is placed on a CPU or given a GPU by Ray before its session opens
BATCH_PROVIDERS = ("cpu", "cuda")
# a local instance on a small machine: the object store only carries shard numbers and
# per-shard stats (the embeddings go straight to disk from the actors)
LOCAL_OBJECT_STORE_BYTES = 500 * 1024 * 1024

Progress = Callable[[int, int, float], None]  # (rows done, rows total, rows/s this run)


class DuplicateIdWarning(UserWarning):
    """Some ids occur in more than one input row (each row still has its output row)."""


def _require_ray():
    ray = require("ortformer batch", "ray", "ray", "ray.data")  # ray.data: the data extra (Dataset, ActorPoolStrategy)
    pyarrow()
    return ray


def embed_corpus(model_path, input_path, output_path, *, ray_address: str | None = None, num_actors: int = 1,
                 batch_size: int = 64, provider: str = "cpu", resume: bool = False, text_field: str = "text",
                 id_field: str = "id", progress: Progress | None = None,
                 shard_rows: int | None = None) -> dict[str, Any]:
    """Embed every text of ``input_path`` into parquet shards under ``output_path``.

    input: ``.jsonl`` (objects with ``text_field`` and optionally ``id_field``) or
    ``.parquet`` (columns of those names). A row without an id gets its row number
    (JSONL: its line number counted from 0). Output: ``output_path/part-XXXXX.parquet``
    with columns ``id`` (int64 or string, as the input) and ``embedding``
    (list<float32> of length S, the model's sentence_size: hidden size, its Dense head's width or truncate_dim): exactly one row per input row.

    model: an ortformer model that pools (sentence_embedding output) and names a
    tokenizer in its metadata. provider: "cpu" or "cuda" (each actor then takes one GPU).
    resume: continue an output a previous (interrupted) call left, skipping its finished
    shards; refused when the input, model, fields or shard_rows changed since.
    shard_rows: rows per shard (default: about 64 shards of 1,024..10,000 rows).
    ray_address: an existing cluster (``ray.init(address=...)``); default: a local Ray
    instance sized for this machine, shut down on return. A process already connected
    to Ray (``ray.is_initialized()``) keeps its connection, which is reused.
    progress: called after each shard with (rows done, rows total, rows/s of this run).

    Returns stats: rows, rows_embedded (this run), shards, shards_skipped, dim, seconds,
    embed_seconds, rows_per_s, duplicate_ids, truncated_shards, output, num_actors, provider.
    Warns DuplicateIdWarning when ids repeat, TruncationWarning when texts were cut.
    """
    started = time.perf_counter()
    _check_arguments(num_actors, batch_size, provider, text_field, id_field)
    ray = _require_ray()
    model_path, input_path, out = Path(model_path), Path(input_path), Path(output_path)
    plan = plan_corpus(input_path, _model_stamp(model_path), text_field, id_field, shard_rows)
    for shard in plan.shards:  # every row checked here, in seconds, not by an actor after Ray started
        read_shard(plan, shard)
    fresh = not out.exists()
    _prepare_output(out, plan, resume)
    try:
        return _embed(ray, plan, out, model_path, ray_address, num_actors, batch_size, provider, progress, started)
    except BaseException:
        if fresh and not finished(out, plan):  # nothing done: leave nothing that blocks the rerun
            shutil.rmtree(out, ignore_errors=True)
        raise


def _embed(ray, plan: Plan, out: Path, model_path: Path, ray_address, num_actors: int, batch_size: int,
           provider: str, progress, started: float) -> dict[str, Any]:
    done = finished(out, plan)
    pending = [s for s in plan.shards if s.index not in done]
    report = progress or (lambda done_rows, total, rate: None)
    skipped_rows = sum(plan.shards[i].rows for i in done)
    report(skipped_rows, plan.rows, 0.0)

    embed_start = time.perf_counter()
    embedded = truncated_shards = 0
    if pending:
        started_ray = _connect(ray, ray_address)
        embed_start = time.perf_counter()  # rows/s counts from here: actor start-up included, Ray's not
        try:
            for rows, truncated in _run(ray, plan, pending, out, model_path, provider, batch_size, num_actors):
                embedded += rows
                truncated_shards += truncated
                rate = embedded / max(time.perf_counter() - embed_start, 1e-9)
                report(skipped_rows + embedded, plan.rows, rate)
        finally:
            if started_ray:
                ray.shutdown()
    embed_seconds = time.perf_counter() - embed_start

    markers = finished(out, plan)
    missing = [s.index for s in plan.shards if s.index not in markers]
    if missing:
        raise OrtformerError(f"shards {missing[:10]} of {out} are not complete after the run; "
                             "run again with resume=True (--resume) to finish them")
    duplicates = _duplicate_ids(out, plan)
    if truncated_shards:
        from ..config.text import TruncationWarning

        warnings.warn(f"texts longer than the model's max_length were truncated in {truncated_shards} "
                      f"shard(s) of {out}", TruncationWarning, stacklevel=2)
    return {
        "rows": plan.rows, "rows_embedded": embedded, "shards": len(plan.shards), "shards_skipped": len(done),
        "dim": next((m["dim"] for m in markers.values()), None), "seconds": time.perf_counter() - started,
        "embed_seconds": embed_seconds, "rows_per_s": embedded / embed_seconds if embedded else 0.0,
        "duplicate_ids": duplicates, "truncated_shards": truncated_shards, "output": str(out),
        "num_actors": num_actors, "provider": provider,
    }


def _check_arguments(num_actors, batch_size, provider, text_field, id_field) -> None:
    for name, value in (("num_actors", num_actors), ("batch_size", batch_size)):
        check_int(name, value)
    if provider not in BATCH_PROVIDERS:
        raise InputError(f"provider={provider!r} is not valid; choose one of {', '.join(BATCH_PROVIDERS)}")
    for name, value in (("text_field", text_field), ("id_field", id_field)):
        if not isinstance(value, str) or not value:
            raise InputError(f"{name}={value!r} must be a non-empty field name")
    if text_field == id_field:
        raise InputError(f"text_field and id_field are both {text_field!r}; name two different fields")


def _model_stamp(path: Path) -> dict[str, Any]:
    """Checks the model can embed texts; returns what identifies its version."""
    from ..runtime import read_model_file, tokenizer_path

    model = read_model_file(path)  # ModelFileError when unreadable or not ortformer's
    if model.config.pooling == "none":
        raise ModelFileError(f"{path}: the model has no sentence_embedding output (pooling='none'); "
                             f"export it with a pooling ({SENTENCE_POOLINGS}) to embed texts")
    tokenizer = tokenizer_path(model)
    if tokenizer is None:
        raise ModelFileError(f"{path}: the model's metadata names no tokenizer ('ortformer.tokenizer'); "
                             "export it with a tokenizer.json to embed texts")
    return {**file_stamp(path), "source": model.source, "tokenizer": file_stamp(tokenizer)}


def _prepare_output(out: Path, plan: Plan, resume: bool) -> None:
    """Create the output folder, or check an existing one may be continued; write the plan."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} exists and is not a folder; choose a new path (e.g. embeddings.parquet)")
    if out.is_dir() and any(out.iterdir()):
        old = read_json(out / MANIFEST)
        if old is None:
            raise OutputError(f"output {out} is a non-empty folder that is not an ortformer batch output; "
                              "choose a new path")
        if not resume:
            raise OutputError(f"output {out} already exists; pass resume=True (--resume) to continue it, "
                              "or remove it to start over")
        if old.get("plan_id") != plan.plan_id:
            raise OutputError(f"cannot resume {out}: {_plan_difference(old, plan.to_dict())} since it was "
                              "started; remove it to start over, or resume with the original settings")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output folder {out}: {exc.strerror or exc}") from None
    remove_stale(out)
    write_json(out / MANIFEST, plan.to_dict())


def _plan_difference(old: dict, new: dict) -> str:
    what = {"input": "the input file changed", "model": "the model (or its tokenizer) changed",
            "text_field": "text_field differs", "id_field": "id_field differs",
            "id_type": "the id type differs", "shard_rows": "shard_rows differs", "shards": "the shards differ",
            "format": "the output format differs"}
    changed = [text for key, text in what.items() if old.get(key) != new.get(key)]
    return "; ".join(changed) or "its plan differs"


def _connect(ray, address: str | None) -> bool:
    """Connect to Ray unless already connected; True when this call started the connection."""
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=available_cpus(), include_dashboard=False,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, **quiet)
            from .ray_guard import guard

            guard()  # Ray's agents outlive a driver killed with SIGKILL; the watchdog ends them
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError: all mean "no cluster"
        where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
        raise OrtformerError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from None
    return True


def _actor_resources(ray, provider: str, num_actors: int) -> tuple[int, int]:
    """(CPUs, GPUs) per actor: the cluster's CPUs shared evenly, at most one node's worth."""
    total = ray.cluster_resources()
    node_cpus = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    cpus = int(max(1, min(node_cpus, total.get("CPU", 0) // num_actors)))
    if provider == "cuda":
        # Ray sets CUDA_VISIBLE_DEVICES per actor, so its one GPU is device 0 inside it
        if total.get("GPU", 0) < num_actors:
            raise InputError(f"num_actors={num_actors} with provider='cuda' needs {num_actors} GPUs; "
                             f"the Ray cluster has {int(total.get('GPU', 0))}")
        return 1, 1
    if num_actors > total.get("CPU", 0):
        raise InputError(f"num_actors={num_actors} is more than the {int(total.get('CPU', 0))} CPUs of the "
                         "Ray cluster; each actor needs at least one")
    return cpus, 0


class ShardEmbedder:
    """Ray Data callable class: embeds whole shards. One Runtime per actor, built here once.

    An OrtformerError (bad row, unusable provider, ...) is returned as data, not raised:
    Ray hands the driver only a traceback string of a raised exception, and the
    driver re-raises it with its type (``_raise_error``)."""

    def __init__(self, model_path: str, provider: str, threads: int, batch_size: int, plan: dict, out: str):
        from ..runtime import Runtime

        self.batch_size = batch_size
        self.plan = Plan.from_dict(plan)
        self.out = Path(out)
        self.error: OrtformerError | None = None
        try:
            self.runtime = Runtime(model_path, provider, threads=threads)
        except OrtformerError as exc:
            self.error = exc  # reported with the first shard this actor gets

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """batch["shard"]: shard numbers -> {"shard", "rows", "truncated", "seconds", "error"} per shard."""
        rows, truncated, seconds, errors = [], [], [], []
        for index in batch["shard"]:
            start = time.perf_counter()
            shard = self.plan.shards[int(index)]
            warned, error = False, ""
            try:
                if self.error is not None:
                    raise self.error
                ids, texts = read_shard(self.plan, shard)
                vectors, warned = self.embed(texts)
                write_shard(self.out, self.plan, shard, ids, vectors, time.perf_counter() - start)
            except OrtformerError as exc:
                error = f"{type(exc).__name__}:{exc}"
            rows.append(0 if error else shard.rows)
            truncated.append(warned)
            seconds.append(time.perf_counter() - start)
            errors.append(error)
        return {"shard": np.asarray(batch["shard"]), "rows": np.asarray(rows),
                "truncated": np.asarray(truncated, dtype=bool), "seconds": np.asarray(seconds),
                "error": np.asarray(errors, dtype=object)}

    def embed(self, texts: list[str]) -> tuple[np.ndarray, bool]:
        """((len(texts), F) float32 in input order, whether any text was truncated).

        The whole shard goes to embed_texts in one call: it tokenizes, sorts the texts by
        token length, runs batches of batch_size similar lengths (little padding) and
        returns the rows in input order."""
        from ..config.text import TruncationWarning

        if not texts:
            return np.empty((0, self.runtime.config.sentence_size), np.float32), False
        with warnings.catch_warnings(record=True) as caught:
            # an actor's warnings would vanish in its log file: count them for the driver
            warnings.simplefilter("always", TruncationWarning)
            vectors = self.runtime.embed_texts(texts, batch_size=self.batch_size, output=contract.SENTENCE_EMBEDDING)
        return vectors, any(issubclass(w.category, TruncationWarning) for w in caught)


def _run(ray, plan: Plan, pending: list, out: Path, model_path: Path, provider: str, batch_size: int,
         num_actors: int):
    """Yield (rows, truncated) of each shard as its actor finishes it."""
    import ray.data

    cpus, gpus = _actor_resources(ray, provider, num_actors)
    context = ray.data.DataContext.get_current()
    saved = {k: getattr(context, k) for k in ("enable_progress_bars", "print_on_execution_start",
                                              "enable_auto_log_stats") if hasattr(context, k)}
    for key in saved:  # our own progress line replaces Ray Data's bars and logs
        setattr(context, key, False)
    data_logger = logging.getLogger("ray.data")
    level = data_logger.level
    data_logger.setLevel(logging.ERROR)  # also "progress bars disabled", which is our doing
    try:
        # one block per shard, so the actors share shards and finish them one by one
        items = ray.data.from_items([{"shard": s.index} for s in pending], override_num_blocks=len(pending))
        results = items.map_batches(
            ShardEmbedder, batch_size=1, compute=ray.data.ActorPoolStrategy(size=num_actors),
            fn_constructor_kwargs={"model_path": str(model_path.absolute()), "provider": provider,
                                   "threads": cpus, "batch_size": batch_size, "plan": plan.to_dict(),
                                   "out": str(out.absolute())},
            num_cpus=cpus, num_gpus=gpus,
        )
        for row in results.iter_rows():
            if row["error"]:
                _raise_error(row["error"])  # closing the iterator stops the other actors
            yield int(row["rows"]), bool(row["truncated"])
    finally:
        for key, value in saved.items():
            setattr(context, key, value)
        data_logger.setLevel(level)


def _raise_error(text: str) -> None:
    """Re-raise an actor's OrtformerError ("TypeName:message") with its type."""
    from ..core import errors

    name, _, message = text.partition(":")
    cls = getattr(errors, name, None)
    error = OrtformerError(message)
    if isinstance(cls, type) and issubclass(cls, OrtformerError):
        try:
            error = cls(message)
        except TypeError:  # a type whose constructor takes more than a message
            pass
    raise error


def _duplicate_ids(out: Path, plan: Plan) -> int:
    """How many rows repeat an id of an earlier row; warns (DuplicateIdWarning) when any do."""
    pa, pq = pyarrow()
    if not plan.shards:
        return 0
    ids = pa.concat_arrays([pq.read_table(out / s.part_name, columns=["id"]).column("id").combine_chunks()
                            for s in plan.shards])
    duplicates = len(ids) - len(ids.unique())
    if duplicates:
        warnings.warn(f"{duplicates} input row(s) repeat an id of another row; every row has its own output "
                      "row, so join on ids with care (or drop the id field to number rows)",
                      DuplicateIdWarning, stacklevel=3)
    return duplicates


__all__ = ["embed_corpus", "ShardEmbedder", "DuplicateIdWarning", "BATCH_PROVIDERS"]
