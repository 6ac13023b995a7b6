"""The models benchmarks/gpu_check.py runs, exported here on the CPU (the GPU machine gets files).

    python benchmarks/gpu_models.py WORKDIR [--minilm FOLDER] [--bert-base]

Writes into WORKDIR:
- parity_<kind>.onnx and parity_<kind>_fp16.onnx for kind in softmax, linear, efficient, cosine:
  2 layers x 128, 4 heads, vocab 1000, 512 positions, random weights (seed 0), and digests.json,
  their weights' digests (the GPU machine rebuilds the eager models from the seed);
- long_linear.onnx: the linear model of benchmarks/linear_long.py (4 x 256, no positions,
  chunk stages, 1,048,576 positions);
- soak.onnx: preset tiny (the reliability soak's model);
- bert_base/ (--bert-base): a Hugging Face BertModel of bert-base shape and its exports
  bert_base.onnx / bert_base_fp16.onnx;
- minilm/ (--minilm): the folder with its weights stored in float16 (half the bytes to carry;
  gpu_check exports it there and loads the same file into transformers);
- fast_path/<model>/fp16_right.onnx and fp16_mask.onnx (--fast-path, after --bert-base and
  --minilm): gpu_fast_path's two float16 graphs, exported here so the GPU's minutes go to timing.

Large random models are incompressible, and the GPU machine takes 64 MiB per call: the
bert-base and long-linear weights are tiled (see tile_) so xz shrinks them ~100x. Tiled
weights change no shape and no kernel, so throughput is that of any such model.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from ortformer.config import preset
from ortformer.exporter import export
from ortformer.exporter.export import weights_digest
from ortformer.models import build_encoder

KINDS = ("softmax", "linear", "efficient", "cosine")
PARITY = preset("small", num_layers=2, hidden_size=128, num_heads=4, ffn_size=512, vocab_size=1000)
LONG = preset("small", num_layers=4, hidden_size=256, num_heads=4, ffn_size=1024, vocab_size=1000,
              positions="none", max_positions=1_048_576, pooling="none", attention="linear")
BLOCK = (61, 67)  # primes: no head size or width is a multiple, so heads and rows stay distinct


@torch.no_grad()
def tile_(module: torch.nn.Module) -> torch.nn.Module:
    """Every tensor of more than 4,096 values becomes its own top-left BLOCK repeated:
    W[i, j] = W[i mod 61, j mod 67] (1-D: w[i] = w[i mod 67]); the rows repeat every 61 rows,
    also after a transpose, which a compressor sees. Smaller tensors (norms, biases) stay."""
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.numel() <= 4096 or not tensor.is_floating_point():
            continue
        flat = tensor.reshape(tensor.shape[0], -1) if tensor.dim() > 1 else tensor.reshape(1, -1)
        rows, cols = flat.shape
        block = flat[: min(rows, BLOCK[0]), : min(cols, BLOCK[1])].clone()
        reps = (-(-rows // block.shape[0]), -(-cols // block.shape[1]))
        flat.copy_(block.repeat(*reps)[:rows, :cols])
    return module


def cli_export(folder: Path, output: Path, dtype: str) -> None:
    subprocess.run([sys.executable, "-m", "ortformer.cli", "export", "--from", str(folder), "-o", str(output),
                    "--dtype", dtype, "--no-parity", "--force"], check=True)


def bert_base(work: Path) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    folder = work / "bert_base"
    tile_(BertModel(BertConfig(), add_pooling_layer=False)).save_pretrained(folder)
    for dtype, name in (("float32", "bert_base.onnx"), ("float16", "bert_base_fp16.onnx")):
        cli_export(folder, work / name, dtype)


def minilm_fp16(source: Path, work: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = work / "minilm"
    shutil.copytree(source, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("README.md", "*.bin", "*.onnx"))
    weights = load_file(str(source / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("--minilm", type=Path, help="all-MiniLM-L6-v2's folder")
    parser.add_argument("--bert-base", action="store_true")
    parser.add_argument("--fast-path", action="store_true", help="export gpu_fast_path's float16 graphs too")
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    digests = {}
    for kind in KINDS:
        cfg = PARITY.replace(attention=kind, name=f"parity-{kind}")
        digests[kind] = weights_digest(build_encoder(cfg, seed=0))  # gpu_check rebuilds the eager model there
        export(cfg, work / f"parity_{kind}.onnx", seed=0, parity=False, force=True)
        export(cfg, work / f"parity_{kind}_fp16.onnx", seed=0, dtype="float16", parity=False, force=True)
    (work / "digests.json").write_text(json.dumps(digests))
    export(tile_(build_encoder(LONG, seed=0)), work / "long_linear.onnx", parity=False, force=True)
    export(preset("tiny"), work / "soak.onnx", seed=0, parity=False, force=True)
    if args.bert_base:
        bert_base(work)
    if args.minilm:
        minilm_fp16(args.minilm, work)
    if args.fast_path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import gpu_fast_path

        for name, folder in gpu_fast_path.model_folders(work, list(gpu_fast_path.MODELS)).items():
            gpu_fast_path.exports(folder, work / "fast_path" / name)
    print(json.dumps(sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())))


if __name__ == "__main__":
    main()
