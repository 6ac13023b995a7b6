"""What the late-interaction tests share (tests/models/test_late_interaction.py, test_bge_m3.py): texts,
tiny folders' tokenizer, exporting a folder, comparing vector lists, editing a file's settings."""
from __future__ import annotations

import json

import numpy as np

from ortformer import contract
from ortformer.exporter import export
from ortformer.models import load_any
from ortformer.runtime import Runtime

from .hf import transformers
from .text_models import minilm_tokenizer

QUERIES = ["what is a cat?", "late interaction, token by token", "x"]
DOCS = ["The cat sat on the mat!", "Tokens (and punctuation: commas, dots...) are scored one by one.", "short",
        "word " * 40]
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
ATOL = 2e-5  # float32 onnxruntime against float32 eager transformers, unit vectors


def hf_tokenizer():
    """transformers' tokenizer of the MiniLM folder (BERT's WordPiece vocabulary), the oracles' own."""
    return transformers.AutoTokenizer.from_pretrained(str(minilm_tokenizer().parent))


def pylate_layout(folder, dense, settings: dict) -> None:
    """PyLate's modules around a saved transformers model in ``folder``: a Transformer at the root, a
    bias-free Dense ``dense`` (out, in) in 1_Dense, and ``settings`` in config_sentence_transformers.json."""
    from safetensors.torch import save_file

    (folder / "1_Dense").mkdir()
    save_file({"linear.weight": dense}, str(folder / "1_Dense" / "model.safetensors"))
    (folder / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": dense.shape[1], "out_features": dense.shape[0], "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))


def exported(folder, path) -> Runtime:
    """``folder`` exported to ``path`` with its tokenizer and settings (parity-gated), opened on the CPU."""
    loaded = load_any(folder)
    export(loaded.model, path, **loaded.export_options())
    return Runtime(path, provider="cpu")


def close(got, want) -> None:
    """Two lists of float32 vector arrays, equal in shape and within ATOL."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)


def with_late(rt, name, **changes):
    """A copy of ``rt``'s file beside it (its tokenizer too), named ``name``, whose late-interaction
    metadata has ``changes`` (the graph is the same)."""
    import onnx

    path = rt.path.with_name(name)
    model = onnx.load(str(rt.path))
    for prop in model.metadata_props:
        if prop.key == contract.META_LATE:
            prop.value = json.dumps({**json.loads(prop.value), **changes})
    onnx.save(model, str(path))
    return path


def cli(*args):
    """`ortformer ARGS` in-process: the click Result."""
    from click.testing import CliRunner

    from ortformer.cli import cli as command

    return CliRunner().invoke(command, [str(a) for a in args])
