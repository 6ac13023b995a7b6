"""Every `--help` example, and every `ortformer` command in a bash block of the README or a docs/
page, runs as written on a tiny model.

Each example runs in a fresh folder holding the files it reads (tiny.onnx, minilm.onnx,
batch.npy, sentences.txt, ...), but not the files it writes, through a real shell (pipes
and redirections as printed). The model files are one tiny text model: BERT's vocabulary,
the MiniLM tokenizer, 512 positions; minilm.onnx is exported from a random BERT folder.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ortformer.cli import cli
from support.fake_hub import fill_cache, folder_files
from support.text_models import minilm_tokenizer

REPO = Path(__file__).resolve().parents[2]
MODEL_NAMES = ("tiny.onnx", "m.onnx", "model.onnx")
# examples that need what this machine or a unit test cannot give: said why, and not run
NOT_RUN = {
    "ortformer bench": "a benchmark (minutes); tests/test_bench.py runs `bench --quick`",
    "ray://": "needs a Ray cluster",
    "--preset bert-base": "a 110M-parameter export: minutes",
    "ortformer serve": "a server runs until it is stopped; tests/serve starts one on a free loopback port",
}
NEEDS_CUDA = "--provider cuda"
HUB_HOME = "hf-home"  # HF_HOME of the examples: a hub cache holding the models they name by hub id


def help_examples() -> list[str]:
    lines = []
    for name, command in sorted(cli.commands.items()):
        text = command.help or ""
        if "Examples:" in text:
            block = text.split("Examples:", 1)[1]
            lines += [line.strip().replace("\\\\", "\\") for line in block.splitlines() if "ortformer " in line]
    return lines


def same_words(example: str) -> str:
    return " ".join(example.split())


DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def doc_examples() -> list[tuple[str, str]]:
    """(page, command) for every `ortformer` line of a ```bash block in the README and docs/*.md,
    less the commands a --help example or an earlier page already runs (word for word)."""
    seen = {same_words(e) for e in help_examples()}
    found = []
    for page in DOC_PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                command = line.split("  #")[0].strip()
                if "ortformer " in command and not command.startswith("#") and same_words(command) not in seen:
                    seen.add(same_words(command))
                    found.append((str(page.relative_to(REPO)), command))
    return found


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every file an example reads, once."""
    transformers = pytest.importorskip("transformers")
    from support.hf import save_hf

    from ortformer.exporter import export
    from ortformer.models import load_any

    folder = tmp_path_factory.mktemp("inputs")
    bert = folder / "all-MiniLM-L6-v2"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=512)
    save_hf(transformers.BertModel, config, bert)
    real = minilm_tokenizer().parent  # its sentence-transformers files: mean pooling, normalized
    for name in ("tokenizer.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(real / name, bert / name)
    shutil.copytree(real / "1_Pooling", bert / "1_Pooling")
    loaded = load_any(bert)
    export(loaded.model, folder / "minilm.onnx", parity=False, **loaded.export_options())
    for name in MODEL_NAMES:  # the same model under each name the examples use
        shutil.copy(folder / "minilm.onnx", folder / name)
        shutil.copy(folder / "minilm.tokenizer.json", folder / f"{Path(name).stem}.tokenizer.json")
        onnx_rename_tokenizer(folder / name, f"{Path(name).stem}.tokenizer.json")
    reranker = folder / "cross-encoder"  # a one-logit classifier, as cross-encoder rerankers are
    transformers.BertForSequenceClassification(transformers.BertConfig(**{**config.to_dict(), "num_labels": 1})) \
        .eval().save_pretrained(str(reranker))
    shutil.copy(real / "tokenizer.json", reranker / "tokenizer.json")
    loaded = load_any(reranker)
    export(loaded.model, folder / "reranker.onnx", parity=False, **loaded.export_options())
    ner = folder / "ner"  # a token classifier, as NER taggers are
    transformers.BertForTokenClassification(transformers.BertConfig(**{**config.to_dict(), "num_labels": 3})) \
        .eval().save_pretrained(str(ner))
    shutil.copy(real / "tokenizer.json", ner / "tokenizer.json")
    loaded = load_any(ner)
    export(loaded.model, folder / "ner.onnx", parity=False, **loaded.export_options())
    splade = splade_folder(folder, config, real)
    loaded = load_any(splade)
    export(loaded.model, folder / "splade.onnx", parity=False, **loaded.export_options())
    loaded = load_any(colbert_ai_folder(folder, config, real))
    export(loaded.model, folder / "colbert.onnx", parity=False, **loaded.export_options())
    # past the Runtime's chunk size (8,192), in the tiny preset's vocabulary: a chunked run
    np.save(folder / "long.npy", np.random.default_rng(0).integers(1, 100, (1, 20_000)))
    np.save(folder / "batch.npy", np.array([[101, 7592, 102], [101, 2088, 102]], np.int64))
    (folder / "sentences.txt").write_text("A first sentence.\nAnother one.\n")
    (folder / "my_config.json").write_text(json.dumps({"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                                       "ffn_size": 64, "vocab_size": 100, "max_positions": 64}))
    (folder / "texts.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                                for i, t in enumerate(["a text", "another text", "a third"])))
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"id": [1, 2], "text": ["a text", "another"]}), folder / "texts.parquet")
    (folder / "path" / "to").mkdir(parents=True)
    shutil.copytree(bert, folder / "path" / "to" / "all-MiniLM-L6-v2")
    # hub ids: the same folder in a hub cache, as a download leaves it, read offline (run_example)
    fill_cache(folder / HUB_HOME / "hub", "sentence-transformers/all-MiniLM-L6-v2", folder_files(bert))
    return folder


def splade_folder(folder: Path, config, tokenizer_folder: Path) -> Path:
    """A sentence-transformers SparseEncoder (fill-mask Transformer + SpladePooling) around a random BERT."""
    st = pytest.importorskip("sentence_transformers")
    transformers = pytest.importorskip("transformers")
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    mlm = folder / "bert-mlm"
    transformers.BertForMaskedLM(config).eval().save_pretrained(str(mlm))
    shutil.copy(tokenizer_folder / "tokenizer.json", mlm / "tokenizer.json")
    model = st.SparseEncoder(modules=[Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=64),
                                      SpladePooling("max", activation_function="relu")], device="cpu")
    model.save(str(folder / "splade"))
    return folder / "splade"


def colbert_ai_folder(folder: Path, config, tokenizer_folder: Path) -> Path:
    """A colbert-ai checkpoint (HF_ColBERT: bert.* and a bias-free linear to 8) around a random BERT
    of 64 positions (a short parity grid for the export example)."""
    import torch
    from safetensors.torch import save_file

    transformers = pytest.importorskip("transformers")
    colbert = folder / "colbertv2"
    torch.manual_seed(1)
    bert = transformers.BertModel(transformers.BertConfig(**{**config.to_dict(), "max_position_embeddings": 64}))
    bert.eval().save_pretrained(str(colbert))
    state = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    save_file({**state, "linear.weight": torch.randn(8, 32)}, str(colbert / "model.safetensors"))
    hf_config = json.loads((colbert / "config.json").read_text())
    (colbert / "config.json").write_text(json.dumps({**hf_config, "architectures": ["HF_ColBERT"]}))
    (colbert / "artifact.metadata").write_text(json.dumps({"query_maxlen": 16, "doc_maxlen": 48, "dim": 8}))
    shutil.copy(tokenizer_folder / "tokenizer.json", colbert / "tokenizer.json")
    return colbert


def onnx_rename_tokenizer(path: Path, name: str) -> None:
    import onnx

    from ortformer import contract

    model = onnx.load(str(path))
    for prop in model.metadata_props:
        if prop.key == contract.META_TOKENIZER:
            prop.value = name
    onnx.save(model, str(path))


def written_by(example: str) -> set[str]:
    words = shlex.split(example.replace("|", " | "))
    out = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--output", ">", "--out", "--repo")}
    firsts = {Path(w).parts[0] for w in out}
    # a model's tokenizer side file is written with it
    return firsts | {f"{Path(w).stem}.tokenizer.json" for w in firsts if w.endswith(".onnx")}


def run_example(example: str, inputs: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ortformer"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from ortformer.cli import main; main()' \"$@\"\n")
    shim.chmod(0o755)
    shutil.copytree(inputs, work, ignore=shutil.ignore_patterns(*written_by(example), HUB_HOME))
    # no hub here: ids resolve offline from the inputs' cache, and any request would go nowhere
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "HF_HOME": str(inputs / HUB_HOME), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(["bash", "-o", "pipefail", "-c", example], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)


def check(example: str, inputs: Path, tmp_path: Path) -> None:
    for marker, why in NOT_RUN.items():
        if marker in example:
            pytest.skip(why)
    done = run_example(example, inputs, tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    if NEEDS_CUDA in example and done.returncode:  # no GPU here: a clean refusal naming CUDA
        assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith("error:"), done.stderr
        assert "cuda" in done.stderr.lower()
        return
    assert done.returncode == 0, (example, done.stdout[-2000:], done.stderr[-2000:])


@pytest.mark.parametrize("example", help_examples())
def test_help_example_runs(example, inputs, tmp_path):
    check(example, inputs, tmp_path)


def test_doc_examples_found():
    """The extraction sees the README's command list and a docs page's block, so a page cannot
    drop out of the test unnoticed."""
    pages = {page for page, _ in doc_examples()}
    assert {"README.md", "docs/families.md", "docs/long-inputs.md"} <= pages, pages


@pytest.mark.parametrize("page,example", doc_examples(), ids=[f"{p}: {e}" for p, e in doc_examples()])
def test_doc_example_runs(page, example, inputs, tmp_path):
    check(example, inputs, tmp_path)
