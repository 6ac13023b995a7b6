"""Throughput on one GPU (benchmarks/gpu_check.py's throughput, profile and kernels sections):
ortformer's ONNX files on CUDA against transformers eager on the same GPU with the same weights,
and where the time goes (onnxruntime's per-op profile; per-kernel GPU time from torch's profiler).

Per model (bert-base shape with tiled weights, all-MiniLM-L6-v2 exported there from gpu_models'
folder), per batch x sequence in SHAPES (no padding), median ms per forward:
- onnxruntime float32 / float16: `Runtime.run` (ids copied in, every output copied back: what a
  caller gets) and `device` (inputs and outputs bound on the GPU once: the graph alone); float32
  also with onnxruntime's TF32 default ("attention": "tf32"), which Runtime turns off;
- transformers float32 eager attention, float32 SDPA, float16 SDPA, outputs left on the GPU.
tokens/s = B * N / time; FLOPs per forward = B * N * L * (8 F^2 + 4 F I + 4 N F) (the matrix
products: Q, K, V, O, the two feed-forward ones, Q K^T and A V), and their rate over the float16
dense matrix peak (datasheet, and a measured 8192^3 float16 product).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ortformer import contract
from ortformer.runtime import Runtime

# where everything runs; "cpu" rehearses the scripts on a machine without a GPU (gpu_check --device)
DEVICE = "cuda"
PROFILE_SHAPE = (256, 128)  # where gpu_check's profile and kernels sections look
SHAPES = ((1, 128), (32, 128), (256, 128), (64, 512))
DATASHEET_FP16_TFLOPS = 989.4  # H100/H200 SXM dense float16, the vendor's datasheet


TIMING_S = 0.5  # each median_ms keeps calling for this long (at least `least` calls)


def median_ms(fn, budget_s: float | None = None, least: int = 5, most: int = 200) -> float:
    """Median wall time of fn() after one warm-up call (fn must return when the GPU is done)."""
    budget_s = TIMING_S if budget_s is None else budget_s
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < least or (len(times) < most and time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * float(np.median(times)), 3)


def forward_flops(cfg: dict, b: int, n: int) -> float:
    f, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return float(b * n * layers * (8 * f * f + 4 * f * i + 4 * n * f))


def synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def measured_fp16_tflops() -> float | None:
    import torch

    if DEVICE != "cuda":
        return None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    ms = median_ms(lambda: (a @ b, torch.cuda.synchronize()), least=10)
    return 2 * 8192 ** 3 / ms / 1e9


def ort_calls(rt: Runtime, b: int, n: int):
    """(Runtime.run on numpy inputs, the session on inputs and outputs bound on the device once)
    for random unpadded (b, n) inputs: two argument-less callables."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = {contract.INPUT_IDS: rng.integers(0, rt.config.vocab_size, (b, n)), contract.ATTENTION_MASK: np.ones((b, n), np.int64)}
    if contract.TOKEN_TYPE_IDS in rt.input_names:
        feeds[contract.TOKEN_TYPE_IDS] = np.zeros((b, n), np.int64)
    binding = rt._session.io_binding()
    values = {k: ort.OrtValue.ortvalue_from_numpy(v, DEVICE, 0) for k, v in feeds.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    for name in rt.output_names:
        binding.bind_output(name, DEVICE, 0)

    def device(bound=values):  # the bound inputs live as long as this callable
        rt._session.run_with_iobinding(binding, rt._run_options)

    return (lambda: rt.run(**feeds)), device


def ort_rows(rt: Runtime, b: int, n: int) -> dict:
    run, device = ort_calls(rt, b, n)
    return {"ms_run": median_ms(run), "ms_device": median_ms(device)}


def eager_call(model, b: int, n: int, vocab: int):
    """One synchronized forward of a transformers model on random unpadded (b, n) ids."""
    import torch

    ids = torch.randint(0, vocab, (b, n), device=DEVICE)
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)

    def forward():
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        synchronize()

    return forward


def with_tf32(rt: Runtime) -> Runtime:
    """rt with its session reopened with onnxruntime's TF32 default (use_tf32=1), which Runtime
    turns off: what float32 costs when MatMul inputs keep 10 mantissa bits."""
    import onnxruntime as ort

    from ortformer.runtime import providers

    (name, options), cpu = providers.provider_list("cuda", 0)
    rt._session = ort.InferenceSession(str(rt.path), providers.session_options(None),
                                       providers=[(name, {**options, "use_tf32": "1"}), cpu])
    return rt


def eager_model(folder: Path, dtype: str, attention: str):
    import torch
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation=attention).to(DEVICE).eval()


def eager_ms(model, b: int, n: int, vocab: int) -> float:
    return median_ms(eager_call(model, b, n, vocab))


def same_weights(folder: Path, path: Path) -> dict:
    """ortformer's float32 file on CUDA against transformers float32 on CUDA, one padded batch."""
    import torch

    model = eager_model(folder, "float32", "eager")
    rt = Runtime(path, DEVICE)
    rng = np.random.default_rng(1)
    ids, mask = rng.integers(0, rt.config.vocab_size, (4, 64)), np.ones((4, 64), np.int64)
    mask[1, 40:] = 0
    with torch.inference_mode():
        want = model(input_ids=torch.from_numpy(ids).to(DEVICE), attention_mask=torch.from_numpy(mask).to(DEVICE),
                     token_type_ids=torch.zeros(4, 64, dtype=torch.long, device=DEVICE)).last_hidden_state.cpu().numpy()
    got = rt.run(input_ids=ids, attention_mask=mask)[contract.LAST_HIDDEN_STATE]
    from ortformer.contract.parity import compare

    return compare(contract.LAST_HIDDEN_STATE, got, want, mask)


def export_there(folder: Path, out: Path) -> dict:
    """all-MiniLM-L6-v2 exported on this machine with its torch (float32 and float16)."""
    files, seconds = {}, {}
    for dtype, name in (("float32", "minilm.onnx"), ("float16", "minilm_fp16.onnx")):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ortformer.cli", "export", "--from", str(folder), "-o", str(out / name),
                        "--dtype", dtype, "--no-parity", "--force"], check=True, capture_output=True, text=True)
        files[dtype], seconds[dtype] = out / name, round(time.perf_counter() - start, 1)
    return {"files": files, "export_seconds": seconds}


def throughput(work: Path, deadline: float) -> dict:
    import torch

    out = {"shapes": [list(s) for s in SHAPES], "datasheet_fp16_tflops": DATASHEET_FP16_TFLOPS,
           "measured_fp16_tflops": measured_fp16_tflops(), "rows": [], "models": {}}
    models = [("bert-base (tiled random weights)", work / "bert_base",
               {"float32": work / "bert_base.onnx", "float16": work / "bert_base_fp16.onnx"})]
    if (work / "minilm").is_dir():
        try:
            exported = export_there(work / "minilm", work)
            models.append(("all-MiniLM-L6-v2 (weights stored as float16)", work / "minilm", exported["files"]))
            out["models"]["all-MiniLM-L6-v2"] = {"export_seconds": exported["export_seconds"]}
        except subprocess.CalledProcessError as exc:
            out["models"]["all-MiniLM-L6-v2"] = {"export_error": (exc.stderr or "")[-1500:]}
    for label, folder, files in models:
        cfg = json.loads((folder / "config.json").read_text())
        info = out["models"].setdefault(label.split(" (")[0], {})
        info["same_weights_fp32"] = same_weights(folder, files["float32"])
        engines = [("onnxruntime", dtype, None) for dtype in files] + [("onnxruntime", "float32", "tf32")] * (DEVICE == "cuda") + [
            ("transformers", "float32", "eager"), ("transformers", "float32", "sdpa"), ("transformers", "float16", "sdpa")]
        for engine, dtype, attention in engines:
            if time.monotonic() > deadline:
                out["cut_short"] = True
                break
            if engine == "onnxruntime":
                model = Runtime(files[dtype], DEVICE)
                model = with_tf32(model) if attention == "tf32" else model
            else:
                model = eager_model(folder, dtype, attention)
            for b, n in SHAPES:
                if time.monotonic() > deadline:
                    out["cut_short"] = True
                    break
                row = {"model": label, "engine": engine, "dtype": dtype, "attention": attention, "batch": b, "sequence": n}
                if engine == "onnxruntime":
                    row.update(ort_rows(model, b, n))
                else:
                    row["ms_device"] = eager_ms(model, b, n, cfg["vocab_size"])
                flops = forward_flops(cfg, b, n)
                for key in ("ms_run", "ms_device"):
                    if key in row:
                        row[key.replace("ms", "tokens_per_s")] = round(b * n / row[key] * 1000)
                row["tflops_device"] = round(flops / row["ms_device"] / 1e9, 2)
                row["share_of_datasheet_fp16_peak"] = round(row["tflops_device"] / DATASHEET_FP16_TFLOPS, 4)
                out["rows"].append(row)
            del model
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return out


def profile(work: Path) -> dict:
    """onnxruntime's per-op profile of bert-base at PROFILE_SHAPE, float32 and float16: where the
    GPU time goes (runtime/profile.py; kernel times as onnxruntime records them)."""
    from ortformer.runtime.profile import profile_ops

    out = {}
    for name in ("bert_base.onnx", "bert_base_fp16.onnx"):
        report = profile_ops(work / name, batch=PROFILE_SHAPE[0], sequence=PROFILE_SHAPE[1], runs=5,
                             provider=DEVICE)
        out[name] = {k: report[k] for k in ("provider", "batch", "sequence", "median_run_ms", "kernel_ms_per_run", "ops")}
        out[name]["top_nodes"] = report["top_nodes"][:5]
    return out


def top_kernels(fn, runs: int = 5, top: int = 12) -> dict:
    """GPU time per kernel name over `runs` calls of fn (torch's profiler reads CUPTI, which
    sees onnxruntime's kernels as well as its own): the top kernels and the total per call."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = DEVICE == "cuda"  # the CPU rehearsal lists torch's CPU ops instead

    def spent(event) -> float:
        return event.device_time_total if on_gpu else event.self_cpu_time_total

    fn()
    with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            fn()
    rows = [(e.key, spent(e) / runs / 1000, e.count // runs) for e in prof.key_averages() if spent(e) > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    return {"gpu_ms_per_call": round(total, 3), "kernels_per_call": sum(r[2] for r in rows),
            "top": [{"kernel": k[:120], "ms_per_call": round(ms, 3), "share": round(ms / total, 4), "launches": c}
                    for k, ms, c in rows[:top]]}


def kernels(work: Path) -> dict:
    """Where the GPU time goes at PROFILE_SHAPE: bert-base float16 in onnxruntime (inputs and
    outputs on the device) against transformers float16 SDPA on the same weights."""
    b, n = PROFILE_SHAPE
    rt = Runtime(work / "bert_base_fp16.onnx", DEVICE)
    out = {"shape": [b, n], "onnxruntime_float16": top_kernels(ort_calls(rt, b, n)[1])}
    del rt
    model = eager_model(work / "bert_base", "float16", "sdpa")
    vocab = json.loads((work / "bert_base" / "config.json").read_text())["vocab_size"]
    out["transformers_float16_sdpa"] = top_kernels(eager_call(model, b, n, vocab))
    return out
