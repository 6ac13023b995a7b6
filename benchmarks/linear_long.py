"""Long-sequence and streaming figures of the linear family (README "Linear attention at any length").

python benchmarks/linear_long.py WORKDIR [THREADS]

Prints one JSON object: chunked time and peak RSS at 131,072 and 1,048,576 tokens (each in a
fresh process), chunked vs eager parity at 16,384 and 131,072 (ids and features), the error
of one layer at 1,048,576 tokens against a float64 reference, and streaming: chunks of 1 and
100 over 4,096 tokens against the full causal run, per-token step latency and RSS over
100,000 single-token steps. One run on a shared machine: noisy, quote it as such.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ortformer.bench.measure import run_isolated
from ortformer.config import preset
from ortformer.exporter import export
from ortformer.exporter.export import eager_runner
from ortformer.models import build_encoder
from ortformer.contract.parity import Case, compare, make_inputs
from ortformer.runtime import Runtime

MILLION = 1_048_576
BASE = preset("small").replace(num_layers=4, hidden_size=256, num_heads=4, ffn_size=1024, vocab_size=1000,
                               positions="none", max_positions=MILLION, pooling="none", attention="linear", name="long")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parity_at(path: Path, cfg, n: int) -> dict:
    inputs = make_inputs(cfg, Case(1, n, "none"), np.random.default_rng(n))
    got = Runtime(path, "cpu").run(**inputs)["last_hidden_state"]
    want = eager_runner(build_encoder(cfg))(inputs)["last_hidden_state"]
    m = compare("last_hidden_state", got, want, inputs["attention_mask"])
    return {"max_abs": m["max_abs"], "min_cosine": m["min_cosine"]}


def one_layer_error(path: Path, cfg, n: int) -> dict:
    """The chunked float32 run of a one-layer model against float64 arithmetic, chunk by chunk."""
    model = build_encoder(cfg).double()
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, n))
    got = Runtime(path, "cpu").run(input_ids=ids)["last_hidden_state"][0]
    blk, f, h = model.blocks[0], cfg.hidden_size, cfg.num_heads
    d = f // h
    spans = [(s, min(s + 8192, n)) for s in range(0, n, 8192)]

    def x_of(s, e):
        return model.norm(model.tokens(torch.from_numpy(ids[0, s:e])))  # (C, F) float64

    kv, z = torch.zeros(h, d, d, dtype=torch.float64), torch.zeros(h, d, dtype=torch.float64)
    with torch.no_grad():
        for s, e in spans:
            q, k, v = blk.attention.qkv(x_of(s, e)).view(e - s, 3, h, d).permute(1, 2, 0, 3)
            phi_k = torch.nn.functional.elu(k) + 1
            kv += phi_k.transpose(-2, -1) @ v
            z += phi_k.sum(dim=1)
        worst, cos = 0.0, 1.0
        for s, e in spans:
            x = x_of(s, e)
            q = blk.attention.qkv(x)[:, :f].view(e - s, h, d).transpose(0, 1)
            phi_q = torch.nn.functional.elu(q) + 1
            heads = (phi_q @ kv) / ((phi_q * z[:, None]).sum(-1, keepdim=True) + cfg.attention_eps)
            y = blk.norm1(x + blk.attention.out(heads.transpose(0, 1).reshape(e - s, f)))
            y = blk.norm2(y + blk.ffn(y)).numpy()
            g = got[s:e].astype(np.float64)
            worst = max(worst, float(np.abs(g - y).max()))
            cos = min(cos, float(((g * y).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(y, axis=1)).min()))
    return {"max_abs": worst, "min_cosine": cos, "max_abs_output": float(np.abs(got).max())}


def streaming(path: Path, cfg) -> dict:
    rt = Runtime(path, "cpu")
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, 4096)
    full = rt.run(input_ids=ids[None])["last_hidden_state"][0]
    result = {}
    for size in (1, 100):
        chunks = [ids[s:s + size] for s in range(0, len(ids), size)]
        got = np.concatenate(list(rt.stream(chunks)))
        result[f"chunks_of_{size}_max_abs"] = float(np.abs(got - full).max())
    steps, times = 100_000, []

    def tokens():
        rng = np.random.default_rng(3)
        for i in range(steps):
            if i == 1000:
                result["rss_after_1000_steps_mb"] = rss_mb()
            yield rng.integers(0, cfg.vocab_size, 1)

    last = time.perf_counter()
    for _ in rt.stream(tokens()):
        now = time.perf_counter()
        times.append(now - last)
        last = now
    result["rss_after_100000_steps_mb"] = rss_mb()
    result["rss_growth_pct"] = 100 * (result["rss_after_100000_steps_mb"] / result["rss_after_1000_steps_mb"] - 1)
    result["step_ms_median"] = 1000 * float(np.median(times[1000:]))
    result["step_ms_p99"] = 1000 * float(np.percentile(times[1000:], 99))
    return result


def main(workdir: str, threads: int = 2) -> None:
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    out = {"model": "4 layers x 256, 4 heads, linear, batch 1, chunk 8192", "threads": threads}
    lin = work / "linear.onnx"
    export(BASE, lin, parity=False, force=True)
    for n in (131072, MILLION):
        out[f"chunked_{n}"] = run_isolated("ortformer.bench.point", [str(lin), str(n), str(threads), "1"], timeout=1800)
    out["time_ratio_1M_131k"] = out[f"chunked_{MILLION}"].get("seconds", float("nan")) / out["chunked_131072"].get("seconds", float("nan"))
    small = BASE.replace(max_positions=131072)
    feats = small.replace(vocab_size=0)
    for name, cfg in (("ids", small), ("features", feats)):
        path = work / f"parity_{name}.onnx"
        export(cfg, path, parity=False, force=True)
        for n in (16384, 131072):
            out[f"parity_{name}_{n}"] = parity_at(path, cfg, n)
    one = BASE.replace(num_layers=1)
    export(one, work / "one_layer.onnx", parity=False, force=True)
    out["one_layer_1M_vs_float64"] = one_layer_error(work / "one_layer.onnx", one, MILLION)
    causal = BASE.replace(causal=True)
    export(causal, work / "causal.onnx", parity=False, force=True)
    out["streaming"] = streaming(work / "causal.onnx", causal)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
