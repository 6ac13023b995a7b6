"""export() takes grouped settings (GraphOptions, TextSettings, Provenance, GateOptions) and still
the flat keywords of older calls; an imported folder is read once on its way to the file, and
the export builds one TextEncoder for its tokenizer check, int8 calibration and text parity."""
from __future__ import annotations

import json
import pathlib

import onnx
import pytest
from support.cli import invoke
from support.text_models import minilm_tokenizer

from ortformer import contract
from ortformer.config import text
from ortformer.config import preset
from ortformer.exporter import GateOptions, GraphOptions, Provenance, TextSettings, export
from ortformer.models import load_any

transformers = pytest.importorskip("transformers")


def st_folder(folder: pathlib.Path, model_cls, config) -> pathlib.Path:
    """A sentence-transformers layout: the Hugging Face config.json at the root beside modules.json
    (the layout whose root config.json used to be parsed again to find the Transformer module)."""
    from support.hf import save_hf

    save_hf(model_cls, config, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 20, "do_lower_case": False}))
    return folder


@pytest.fixture
def config_reads(monkeypatch):
    """The config.json files read (as text), in order."""
    reads = []
    real = pathlib.Path.read_text

    def spy(self, *args, **kwargs):
        if self.name == "config.json":
            reads.append(self.resolve())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", spy)
    return reads


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_load_any_parses_the_model_config_once(tmp_path, config_reads, family):
    """ALBERT's loader is one of those that read config.json again for its own settings."""
    if family == "bert":
        model_cls, config = transformers.BertModel, transformers.BertConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=24)
    else:
        model_cls, config = transformers.AlbertModel, transformers.AlbertConfig(
            vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=24)
    folder = st_folder(tmp_path / family, model_cls, config)
    loaded = load_any(folder)
    assert loaded.config.pooling == "mean" and loaded.folder.config["model_type"] == family
    assert config_reads.count((folder / "config.json").resolve()) == 1, config_reads


def test_a_folder_export_reads_config_once_and_builds_one_text_encoder(tmp_path, config_reads, monkeypatch):
    built = []
    real_init = text.TextEncoder.__init__

    def counted(self, *args, **kwargs):
        built.append(args[0])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(text.TextEncoder, "__init__", counted)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=24)
    folder = st_folder(tmp_path / "bert", transformers.BertModel, config)
    (folder / "tokenizer.json").write_bytes(minilm_tokenizer().read_bytes())
    out = tmp_path / "m.onnx"
    summary = json.loads(invoke("export", "--from", folder, "-o", out, "--quantize", "int8", "--truncate-dim", "16",
                                "--json").stdout)
    assert config_reads.count((folder / "config.json").resolve()) == 1, config_reads
    # the tokenizer check, the int8 calibration and the real-sentence parity share one TextEncoder
    assert len(built) == 1, built
    assert summary["parity"]["text"]["sentences"] > 0  # the text parity ran on it
    assert "real sentences" in metadata(out)[contract.META_INT8]  # and so did the int8 calibration
    assert summary["config"]["truncate_dim"] == 16  # the CLI's choice, applied by load_any


def metadata(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def test_grouped_settings_and_flat_keywords_write_the_same_file(tmp_path):
    cfg = preset("tiny")
    grouped = export(cfg, tmp_path / "g.onnx", graph=GraphOptions(dtype="float16", chunked=False),
                     text=TextSettings(max_length=16, prompts={"q": "query: "}, default_prompt="q"),
                     provenance=Provenance(source="test:grouped", family="bert"), gate=GateOptions(parity=False))
    flat = export(cfg, tmp_path / "f.onnx", dtype="float16", chunked=False, text_max_length=16,
                  prompts={"q": "query: "}, default_prompt="q", source="test:grouped", family="bert", parity=False)
    assert grouped.source == flat.source == "test:grouped"
    assert metadata(grouped.path) == metadata(flat.path)
    assert json.loads(metadata(grouped.path)["ortformer.parity"])["dtype"] == "float16"
    # a flat keyword is set over its group
    mixed = export(cfg, tmp_path / "m.onnx", provenance=Provenance(source="a", family="bert"), source="b",
                   parity=False)
    assert mixed.source == "b" and metadata(mixed.path)["ortformer.family"] == "bert"


def test_export_refuses_unknown_keywords_and_groups_of_the_wrong_type(tmp_path):
    with pytest.raises(TypeError, match="tokeniser"):
        export(preset("tiny"), tmp_path / "x.onnx", tokeniser="t.json")
    with pytest.raises(TypeError, match="GraphOptions"):
        export(preset("tiny"), tmp_path / "x.onnx", graph={"dtype": "float16"})
    assert not (tmp_path / "x.onnx").exists()
