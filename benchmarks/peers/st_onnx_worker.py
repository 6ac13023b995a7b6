"""sentence-transformers' ONNX backend in a process of its own, answering one line at a time.

    python -m benchmarks.peers.st_onnx_worker --folder MODEL --workdir DIR --threads T --texts TEXTS.json

Its imports (transformers 4.57, optimum-onnx, sentence-transformers 5) come from the peers
overlay (overlay.py) that the bench puts in front of the venv, so they cannot meet the
bench process's transformers 5. It loads the three variants, then waits on stdin; while
the bench times another contender it is blocked reading, so it takes no CPU.

Protocol (one line each way, UTF-8):

    worker:  ready NAME NAME ...        after loading; or `error MESSAGE` and exit 1
    bench:   encode NAME                worker: ok SECONDS   (all texts, batch_size 32)
    bench:   embeddings NAME PATH       worker: ok PATH      (float32 (texts, dim) .npy)
    bench:   quit                       worker exits
    any command that fails:             worker: error MESSAGE (and keeps serving)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

from ortformer.core.errors import InputError

# name -> file under the model's onnx/ folder (None: the plain export, onnx/model.onnx);
# the int8 file name follows the quantization scheme (quint8 in sentence-transformers 5)
VARIANTS = {"st_onnx": None, "st_onnx_O3": "model_O3.onnx", "st_onnx_int8": "model_*int8_{config}.onnx"}


def int8_config(machine: str | None = None, flags: frozenset[str] | None = None) -> str:
    """The sentence-transformers quantization config a user of this CPU would pick: arm64,
    avx512_vnni, avx512 or avx2 (its four presets)."""
    import platform

    from ortformer.modelfile.int8_kernels import cpu_flags

    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64"):
        return "arm64"
    flags = cpu_flags() if flags is None else flags
    return "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512bw" in flags else "avx2"


COMMANDS = {"encode": 1, "embeddings": 2, "quit": 0}  # verb -> argument count
BATCH_SIZE = 32


def parse_command(line: str) -> tuple[str, list[str]]:
    """``"embeddings st_onnx /tmp/a b.npy"`` -> ("embeddings", ["st_onnx", "/tmp/a b.npy"]).

    The last argument takes the rest of the line, so a path may hold spaces.
    """
    verb, _, rest = line.strip().partition(" ")
    if verb not in COMMANDS:
        raise InputError(f"unknown command {verb!r}; the worker answers {', '.join(COMMANDS)}")
    count = COMMANDS[verb]
    if not rest:
        args = []
    else:  # a verb without arguments keeps the whole rest as one, so `quit now` is refused too
        args = rest.split(" ", max(count - 1, 0))
    if len(args) != count or any(not a for a in args):
        raise InputError(f"{verb!r} takes {count} argument(s), got {line.strip()!r}")
    return verb, args


def handle(line: str, models: dict, texts: list[str]) -> str:
    """The reply line (without newline) to one command line; failures become `error ...`."""
    import numpy as np

    try:
        verb, args = parse_command(line)
        if verb == "quit":
            return "ok"
        if args[0] not in models:
            raise InputError(f"no model {args[0]!r} here; loaded: {', '.join(models)}")
        model = models[args[0]]
        if verb == "encode":
            start = time.perf_counter()
            model.encode(texts, batch_size=BATCH_SIZE)
            return f"ok {time.perf_counter() - start!r}"
        embeddings = np.asarray(model.encode(texts, batch_size=BATCH_SIZE), dtype=np.float32)
        np.save(args[1], embeddings, allow_pickle=False)
        return f"ok {args[1]}"
    except Exception as error:  # reported to the bench, which names it; the worker keeps serving
        return "error " + f"{type(error).__name__}: {error}".replace("\n", " ")[:1000]


def serve(models: dict, texts: list[str], rx: TextIO, tx: TextIO) -> None:
    """Announce the models, then answer commands until `quit` or end of input."""
    tx.write("ready " + " ".join(models) + "\n")
    tx.flush()
    for line in rx:
        if not line.strip():
            continue
        tx.write(handle(line, models, texts) + "\n")
        tx.flush()
        if line.split() == ["quit"]:
            return


def peer_session_options(threads: int):
    """onnxruntime's defaults, as a user of the backend gets them, with the bench's thread count
    and ortformer's spinning (spin_within_runs). Not ortformer's session_options: its memory
    bounds (no CPU arena, no memory pattern) cost this backend about 40% on MiniLM (100
    sentences, 1 thread: 7.1-7.8 s against 4.9-5.4 s). The default spinning after each run
    would busy-wait on the cores the next contender runs on."""
    import onnxruntime as ort

    from ortformer.runtime.providers import spin_within_runs

    options = spin_within_runs(ort.SessionOptions())
    options.intra_op_num_threads = threads
    return options


def load_models(folder: Path, workdir: Path, threads: int) -> dict:
    """The plain ONNX export of ``folder``, its O3 optimization and its dynamic int8 quantization
    (the preset for this CPU: int8_config), each exported once into ``workdir/minilm-st-onnx``,
    on the CPU provider."""
    import shutil

    from sentence_transformers import (SentenceTransformer, export_dynamic_quantized_onnx_model,
                                       export_optimized_onnx_model)

    local = workdir / "minilm-st-onnx"
    if not local.exists():
        shutil.copytree(folder, local)
    kwargs = {"provider": "CPUExecutionProvider", "session_options": peer_session_options(threads)}
    plain = SentenceTransformer(str(local), device="cpu", backend="onnx", model_kwargs=kwargs)
    onnx_dir = local / "onnx"
    if not (onnx_dir / "model.onnx").exists():
        plain.save_pretrained(str(local))  # writes onnx/model.onnx, which O3 and int8 start from
    if not (onnx_dir / VARIANTS["st_onnx_O3"]).exists():
        export_optimized_onnx_model(plain, "O3", str(local))
    config = int8_config()
    patterns = {name: VARIANTS[name].format(config=config) for name in ("st_onnx_O3", "st_onnx_int8")}
    if not list(onnx_dir.glob(patterns["st_onnx_int8"])):
        export_dynamic_quantized_onnx_model(plain, config, str(local))
    models = {"st_onnx": plain}
    for name, pattern in patterns.items():
        found = sorted(onnx_dir.glob(pattern))
        if not found:
            raise FileNotFoundError(f"no {pattern} in {onnx_dir} after the export")
        models[name] = SentenceTransformer(str(local), device="cpu", backend="onnx",
                                           model_kwargs={**kwargs, "file_name": f"onnx/{found[0].name}"})
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="a sentence-transformers model folder")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--texts", type=Path, required=True, help="a JSON list of strings")
    args = parser.parse_args(argv)
    return run_worker(lambda: load_models(args.folder, args.workdir, args.threads), args.texts, args.threads)


def run_worker(load, texts_path: Path, threads: int) -> int:
    """A worker's life: the protocol takes the real stdout (what a library prints goes to stderr,
    the bench's log), torch gets ``threads`` (the export or a converter runs in it), ``load()``
    builds the runners, and requests are answered until stdin ends; a failure to start is sent
    as one "error ..." line before it is raised."""
    tx = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import torch

        torch.set_num_threads(threads)
        texts = json.loads(texts_path.read_text(encoding="utf-8"))
        runners = load()
    except Exception as error:
        tx.write("error " + f"{type(error).__name__}: {error}".replace("\n", " ")[:1000] + "\n")
        tx.flush()
        raise
    serve(runners, texts, sys.stdin, tx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
