"""What a user would pick instead of ortformer, timed beside it in the same interleaved run.

- Hugging Face transformers eager, on the same weights (a random-init BertModel saved
  with save_pretrained and imported the way `ortformer export --from` does);
- that model through torch.onnx (legacy TorchScript exporter) and onnxruntime's
  transformers optimizer (model_type="bert"), run by plain onnxruntime;
- sentence-transformers' ONNX backend (plain, O3, dynamic int8) on the real-model
  scenario, from a worker process of its own (st_onnx_peer.py);
- onnxruntime's MatMul at the model's own GEMM shapes: the ceiling a float32 model's
  GFLOP/s is judged against.

Ratios are between medians of one interleaved run (measure.side_by_side): a peer's
luck on a noisy machine moves both sides alike.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from ..contract.cost import total_flops
from ..exporter import export
from ..runtime.providers import session_options
from .measure import graph_session, side_by_side


def hf_bert_folder(workdir: Path, cfg) -> Path:
    """A random-init transformers BertModel at cfg's shape, saved with save_pretrained (seed 0)."""
    import transformers

    folder = workdir / f"hf-bert-{cfg.name}"
    if not folder.exists():
        shape = transformers.BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                                        intermediate_size=cfg.ffn_size, max_position_embeddings=cfg.max_positions,
                                        type_vocab_size=cfg.type_vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            transformers.BertModel(shape, add_pooling_layer=False).eval().save_pretrained(str(folder))
    return folder


def gemm_shapes(cfg, batch: int, n: int) -> list[dict]:
    """Each distinct MatMul of a softmax BERT forward at (batch, n), with how often it runs.

    Dense: (B*N, F) x (F, F) four times a layer (Q, K, V, output), (B*N, F) x (F, ffn) and
    (B*N, ffn) x (ffn, F) once. Attention core, batched over B*H: (N, D) x (D, N) and (N, N) x (N, D).
    """
    m, f, d, bh, layers = batch * n, cfg.hidden_size, cfg.head_size, batch * cfg.num_heads, cfg.num_layers
    return [
        {"batch": 1, "m": m, "k": f, "n": f, "count": 4 * layers},
        {"batch": 1, "m": m, "k": f, "n": cfg.ffn_size, "count": layers},
        {"batch": 1, "m": m, "k": cfg.ffn_size, "n": f, "count": layers},
        {"batch": bh, "m": n, "k": d, "n": n, "count": layers},
        {"batch": bh, "m": n, "k": n, "n": d, "count": layers},
    ]


def matmul_seconds(shape: dict, threads: int, iterations: int) -> float:
    """Median seconds of one onnxruntime MatMul node at `shape`, with Runtime's session options.

    Dense shapes carry the weight as an initializer (as the model does); batched attention
    shapes take both operands as inputs (as the model's Q K^T and P V do).
    """
    rng = np.random.default_rng(0)
    b, m, k, n = shape["batch"], shape["m"], shape["k"], shape["n"]
    lead = [b] if b > 1 else []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, lead + [m, k])]
    feeds = {"x": rng.standard_normal(lead + [m, k]).astype(np.float32)}
    initializers = []
    if b > 1:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, lead + [k, n]))
        feeds["w"] = rng.standard_normal(lead + [k, n]).astype(np.float32)
    else:
        initializers.append(helper.make_tensor("w", TensorProto.FLOAT, [k, n], rng.standard_normal(k * n).astype(np.float32)))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ceiling", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, lead + [m, n])], initializers)
    session = graph_session(graph, threads)
    return side_by_side({"matmul": lambda: session.run(None, feeds)}, iterations)["matmul"]["median_s"]


def matmul_ceiling(cfg, batch: int, n: int, threads: int, iterations: int) -> dict:
    """onnxruntime's MatMul GFLOP/s at the model's own GEMM mix.

    ceiling = sum(count * 2 B M K N) / sum(count * median_seconds(shape)), so each shape
    weighs as much as it does in the model.
    """
    shapes = gemm_shapes(cfg, batch, n)
    for shape in shapes:
        shape["seconds"] = matmul_seconds(shape, threads, iterations)
        shape["gflops"] = 2 * shape["batch"] * shape["m"] * shape["k"] * shape["n"] / shape["seconds"] / 1e9
    flops = sum(s["count"] * 2 * s["batch"] * s["m"] * s["k"] * s["n"] for s in shapes)
    return {"gflops": flops / sum(s["count"] * s["seconds"] for s in shapes) / 1e9, "shapes": shapes}


def _hf_onnx_optimized(workdir: Path, hf_model, cfg, feeds: dict) -> Path:
    """transformers' model -> torch.onnx (legacy exporter) -> onnxruntime's bert optimizer."""
    from onnxruntime.transformers.optimizer import optimize_model

    raw, optimized = workdir / f"hf-{cfg.name}-raw.onnx", workdir / f"hf-{cfg.name}-optimized.onnx"
    if optimized.exists():
        return optimized
    names = list(feeds)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    # the dynamo exporter's opset-23 Attention op is what onnxruntime's bert optimizer does not
    # fuse; the TorchScript exporter writes the MatMul/Softmax pattern the optimizer was made for
    class ByName(torch.nn.Module):
        """transformers' forward takes these by keyword (other arguments sit between them)."""

        def __init__(self):
            super().__init__()
            self.inner = hf_model

        def forward(self, *tensors):
            return self.inner(**dict(zip(names, tensors)), use_cache=False).last_hidden_state

    with warnings.catch_warnings():
        # the legacy exporter's deprecation and transformers' tracer notes are about this choice, not the user's run
        warnings.simplefilter("ignore")
        torch.onnx.export(ByName(), tuple(torch.from_numpy(feeds[k]) for k in names), str(raw), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    model = optimize_model(str(raw), model_type="bert", num_heads=cfg.num_heads, hidden_size=cfg.hidden_size)
    model.save_model_to_file(str(optimized))
    return optimized


def bert_peers(workdir: Path, cfg, batch: int, n: int, threads: int, iterations: int,
               also: dict | None = None) -> dict:
    """ortformer (float32, int8, imported from a transformers folder) against transformers
    eager and transformers -> torch.onnx -> onnxruntime optimizer, on the same weights.

    Rows: median_ms, gflops = model FLOPs / median, share_of_ceiling = gflops / ceiling,
    vs_best_peer = best peer's median / this contender's median (> 1: faster than every peer).
    also: the caller's own contenders (name -> callable), timed in the same interleaved run,
    their side_by_side stats under "same_run": a scenario that timed ortformer in a run of its
    own reported two figures for one model (7.59 ms and 0.245 ms on a busy machine).
    """
    import transformers

    from ..models import load_any
    from ..contract.parity import Case, make_inputs
    from ..runtime import Runtime

    folder = hf_bert_folder(workdir, cfg)
    loaded = load_any(folder)
    ours = {}
    for name, options in (("ortformer_float32", {}), ("ortformer_int8", {"quantize": "int8"})):
        path = workdir / f"hf-{cfg.name}-{name}.onnx"
        if not path.exists():
            export(loaded.model, path, parity=False, source=loaded.source, **options)
        ours[name] = Runtime(path, "cpu", threads=threads)
    feeds = make_inputs(loaded.model.config, Case(batch, n, "none"), np.random.default_rng(0))
    feeds = {k: feeds[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in feeds}
    hf = transformers.BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    args = {k: torch.from_numpy(v) for k, v in feeds.items()}

    def hf_eager():
        with torch.inference_mode():
            hf(**args)

    runners = {"transformers_eager": hf_eager}
    unavailable = {}
    try:
        session = ort.InferenceSession(str(_hf_onnx_optimized(workdir, hf, cfg, feeds)), session_options(threads),
                                       providers=["CPUExecutionProvider"])
        runners["transformers_onnx_optimized"] = lambda: session.run(None, feeds)
    except Exception as error:  # a peer that cannot run here is reported, not fatal
        unavailable["transformers_onnx_optimized"] = f"{type(error).__name__}: {error}"[:300]
    peer_names = list(runners)
    runners.update({k: (lambda r=r: r.run(**feeds)) for k, r in ours.items()})
    runners.update(also or {})
    stats = side_by_side(runners, iterations)
    same_run = {name: stats.pop(name) for name in also or {}}
    ceiling = matmul_ceiling(loaded.model.config, batch, n, threads, iterations)
    return {"batch": batch, "sequence": n, "weights": "random-init transformers BertModel, save_pretrained, seed 0",
            "unavailable": unavailable, "matmul_ceiling": ceiling, "same_run": same_run,
            **peer_rows(stats, peer_names, total_flops(loaded.model.config, n) * batch, ceiling["gflops"])}


def peer_rows(stats: dict, peer_names: list[str], flops: float, ceiling_gflops: float) -> dict:
    """Rows from side_by_side's medians: each against the fastest peer and the MatMul ceiling."""
    best = min(peer_names, key=lambda k: stats[k]["median_s"])
    rows = []
    for name, v in stats.items():
        gflops = flops / v["median_s"] / 1e9
        rows.append({"contender": name, "peer": name in peer_names, "median_ms": v["median_s"] * 1e3, "gflops": gflops,
                     "share_of_ceiling": gflops / ceiling_gflops,
                     "vs_best_peer": stats[best]["median_s"] / v["median_s"]})
    return {"best_peer": best, "rows": rows}


def format_peers(peers: dict) -> list[str]:
    """Report lines: each contender beside the best peer and the ceiling; unavailable peers named."""
    lines = [f"  peers at batch {peers['batch']}, seq {peers['sequence']} ({peers['weights']}); "
             f"onnxruntime MatMul ceiling at the model's GEMM shapes {peers['matmul_ceiling']['gflops']:.4g} GFLOP/s"]
    for r in peers["rows"]:
        lines.append(f"    {r['contender']:<30} {r['median_ms']:>9.4g} ms  vs best peer ({peers['best_peer']}) "
                     f"{r['vs_best_peer']:.3g}x  {r['gflops']:.4g} GFLOP/s = {100 * r['share_of_ceiling']:.3g}% of ceiling")
    for name, why in peers["unavailable"].items():
        lines.append(f"    {name}: not available here ({why})")
    return lines


__all__ = ["bert_peers", "matmul_ceiling", "matmul_seconds", "gemm_shapes", "peer_rows", "format_peers"]
