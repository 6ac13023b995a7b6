"""Where ortformer float32 loses time on the CPU: session options, graph and batch shape measured
apart, interleaved in one process (docs/performance.md, "The float32 gap").

    python benchmarks/cpu_float32_gap.py minilm.onnx --std minilm.std.onnx --threads 1 2

minilm.onnx: `ortformer export --from <all-MiniLM-L6-v2 folder>` (the fused export);
minilm.std.onnx: the same with --no-fused-ops (standard ONNX ops, which onnxruntime fuses at load).
Every variant is a Runtime on the same texts (SENTENCES of corpus.py, embed_texts as a user calls
it), changed in one thing against Runtime's defaults ("runtime"):

    no_spin        session.intra_op.allow_spinning = 0: workers sleep between ops
    spin_Nus       session.intra_op.spin_duration_us = N: a worker spins N microseconds, then sleeps
    spin_after     spinning on after each run too (onnxruntime's default; no force_spinning_stop)
    arena          the CPU memory arena kept between calls
    arena_pattern  the arena and memory patterns (one allocation plan per input shape)
    ort_defaults   onnxruntime's SessionOptions() as they come (arena, patterns, spinning)
    affinity       each intra-op worker pinned to its own core, the calling thread to core 0
    std_export     the standard-ops file: onnxruntime's own fusions at load instead of ortformer's
    no_rewrites    the fused file with onnxruntime's graph rewrites off (what they add to it)
    skip_ln_fusion onnxruntime's SkipLayerNormFusion back in (int8_kernels.CPU_DISABLED_FUSIONS
                   leaves it out of every CPU session: this measures that choice on your CPU)
    tokens_N       N padded tokens per thread and batch instead of 256 (runtime/batching.py)

Per thread count: a warm-up pass per variant, then --rounds rounds in which each variant embeds all
texts once, the order rotated each round; sentences/s from the median round, and each variant's
ratio to "runtime" per round (median, min, max: a setting that wins clearly wins in every round).
Each variant's outputs are checked against "runtime"'s at the float32 gate. Prints one JSON object
with the load average and the CPU flags, as figures on a shared machine need.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings

import numpy as np
import onnxruntime as ort

from ortformer import contract
from ortformer.core.corpus import sentences
from ortformer.contract.parity import GATES, compare, passes
from ortformer.modelfile import int8_kernels
from ortformer.runtime import Runtime, machine, providers
from ortformer.runtime.session import CPU_TOKENS_PER_THREAD

SENTENCES = 128
BUDGETS = (128, 512, 1024)


def options(threads: int, change: str) -> ort.SessionOptions | None:
    """Runtime's default options with one change (None: Runtime builds its own)."""
    if change == "ort_defaults":
        plain = ort.SessionOptions()
        plain.intra_op_num_threads = threads
        return plain
    made = providers.session_options(threads)
    made.log_severity_level = 3  # replacing a default config entry logs a warning each time
    if change == "no_spin":
        made.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif change.startswith("spin_") and change.endswith("us"):  # spin this long, then sleep (onnxruntime >= 1.27)
        made.add_session_config_entry("session.intra_op.spin_duration_us", change[len("spin_"):-len("us")])
    elif change == "spin_after":
        made.add_session_config_entry("session.force_spinning_stop", "0")
    elif change in ("arena", "arena_pattern"):
        made.enable_cpu_mem_arena = True
        made.enable_mem_pattern = change == "arena_pattern"
    elif change == "affinity" and threads > 1:
        # onnxruntime pins the threads - 1 workers it starts (1-based logical processors); the caller's
        # thread is pinned to core 0 around its calls (pinned())
        made.add_session_config_entry("session.intra_op_thread_affinities", ";".join(str(i + 2) for i in range(threads - 1)))
    elif change == "no_rewrites":
        made.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return made


@contextlib.contextmanager
def without_disabled_fusions():
    """Runtimes made inside get every onnxruntime rewrite, the ones Runtime leaves out on the CPU too."""
    kept = int8_kernels.CPU_DISABLED_FUSIONS
    int8_kernels.CPU_DISABLED_FUSIONS = ()
    try:
        yield
    finally:
        int8_kernels.CPU_DISABLED_FUSIONS = kept


def variants(model: str, std: str | None, threads: int, only: list[str] | None = None) -> dict[str, tuple[Runtime, int, bool]]:
    """name -> (Runtime, max_tokens, pin the calling thread); ``only``: these names (and "runtime")."""
    made = {}
    budget = CPU_TOKENS_PER_THREAD * threads
    for change in ("runtime", "no_spin", "spin_20us", "spin_200us", "spin_after", "arena", "arena_pattern", "ort_defaults", "affinity",
                   "no_rewrites"):
        given = None if change == "runtime" else options(threads, change)
        made[change] = (Runtime(model, "cpu", threads=threads, session_options=given), budget, change == "affinity")
    with without_disabled_fusions():
        made["skip_ln_fusion"] = (Runtime(model, "cpu", threads=threads), budget, False)
    if std:
        made["std_export"] = (Runtime(std, "cpu", threads=threads), budget, False)
    for tokens in BUDGETS:
        made[f"tokens_{tokens}"] = (made["runtime"][0], tokens * threads, False)
    return {name: made[name] for name in made if not only or name == "runtime" or name in only}


def embed(runtime: Runtime, texts: list[str], max_tokens: int, pin: bool) -> np.ndarray:
    if not pin:
        return runtime.embed_texts(texts, max_tokens=max_tokens)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(before)[0]})  # Linux: pid 0 is the calling thread
    try:
        return runtime.embed_texts(texts, max_tokens=max_tokens)
    finally:
        os.sched_setaffinity(0, before)


def measure(model: str, std: str | None, threads: int, rounds: int, count: int, only: list[str] | None = None) -> dict:
    texts = sentences(count)
    made = variants(model, std, threads, only)
    names = list(made)
    outputs = {name: embed(made[name][0], texts, *made[name][1:]) for name in names}  # warm-up
    want = outputs["runtime"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    load_before = os.getloadavg()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            runtime, max_tokens, pin = made[name]
            start = time.perf_counter()
            embed(runtime, texts, max_tokens, pin)
            seconds[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    rows = {}
    for name in names:
        ratios = [base / mine for base, mine in zip(seconds["runtime"], seconds[name])]  # > 1: faster than runtime
        metrics = compare(contract.SENTENCE_EMBEDDING, outputs[name], want, np.ones((len(texts), 1)))
        rows[name] = {"sentences_per_s": round(count / statistics.median(seconds[name]), 1),
                      "vs_runtime_median": round(statistics.median(ratios), 3),
                      "vs_runtime_min": round(min(ratios), 3), "vs_runtime_max": round(max(ratios), 3),
                      "seconds": [round(s, 3) for s in seconds[name]],
                      "max_abs_vs_runtime": metrics["max_abs"], "float32_gate": passes(metrics, GATES["float32"])}
    return {"threads": threads, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in load_after], "variants": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--std", help="the same model exported with --no-fused-ops")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=SENTENCES)
    parser.add_argument("--only", nargs="+", help="measure these variants (and runtime) only")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # truncation of the few long paragraphs is the same for every variant
    cpu = machine.this_cpu()
    result = {"model": args.model, "cpu": cpu.model, "flags": cpu.relevant_flags, "sentences": args.sentences,
              "rounds": args.rounds, "onnxruntime": ort.__version__,
              "runs": [measure(args.model, args.std, t, args.rounds, args.sentences, args.only) for t in args.threads]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
