"""Import an ALBERT folder (paraphrase-albert and its kin).

ALBERT is ELECTRA's layout with shared layers: embeddings LN_E(word + type + position)
E = embedding_size wide, ``embedding_hidden_mapping_in`` (a Linear E -> F, always present),
then BERT's post-norm layers. Layer weights live in ``num_hidden_groups`` groups of
``inner_group_num`` layers; step i of ``num_hidden_layers`` runs every layer of group
g = int(i / (num_hidden_layers / num_hidden_groups)) in turn. ortformer unrolls that into
num_hidden_layers x inner_group_num blocks, each holding a copy of its group's weights
(the ONNX file is that many times larger than the shared checkpoint; the arithmetic is
the same).
"""
from __future__ import annotations


from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..bert_layout import bert_fields, bert_layout_shapes, check_bert_layout, split_dropped, to_ortformer
from ..config_checks import make_config, require
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..spm_tokenizers import albert_tokenizer

# AlbertConfig's defaults, for config.json files that leave them out
DEFAULTS = {"embedding_size": 128, "hidden_act": "gelu_new", "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "num_hidden_groups": 1, "inner_group_num": 1}
# task heads of AlbertFor... checkpoints
DROPPED_PREFIXES = ("pooler.", "predictions.", "sop_classifier.", "classifier.", "qa_outputs.")
# ALBERT layer name -> BERT-layout layer name
LAYER_NAMES = {"attention.query": "attention.self.query", "attention.key": "attention.self.key",
               "attention.value": "attention.self.value", "attention.dense": "attention.output.dense",
               "attention.LayerNorm": "attention.output.LayerNorm", "ffn": "intermediate.dense",
               "ffn_output": "output.dense", "full_layer_layer_norm": "output.LayerNorm"}


def _settings(hf: dict) -> dict:
    hf = {**DEFAULTS, **hf}
    require(hf, "ALBERT", ("num_hidden_layers", "num_hidden_groups", "inner_group_num"))
    if hf["num_hidden_groups"] > hf["num_hidden_layers"]:
        raise CheckpointError(f"ALBERT config.json num_hidden_groups={hf['num_hidden_groups']} exceeds "
                              f"num_hidden_layers={hf.get('num_hidden_layers')}: some groups would never run")
    return hf


def albert_config(hf: dict, common: dict) -> EncoderConfig:
    hf = _settings(hf)
    check_bert_layout(hf, "ALBERT ")
    fields = bert_fields(hf)
    # the E -> F Linear is there even when E == F: embedding_size stays set, so the model keeps it
    fields.update(num_layers=hf["num_hidden_layers"] * hf["inner_group_num"], embedding_size=hf["embedding_size"])
    return make_config("ALBERT", **fields, **common)


def shared_layers(hf: dict) -> list[str]:
    """The ALBERT layer prefix each unrolled block takes its weights from, in order."""
    layers, groups, inner = hf["num_hidden_layers"], hf["num_hidden_groups"], hf["inner_group_num"]
    return [f"encoder.albert_layer_groups.{int(i / (layers / groups))}.albert_layers.{j}."
            for i in range(layers) for j in range(inner)]


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, hf: dict) -> tuple[Tensors, list[str]]:
    """Check an ALBERT state dict, unroll its shared layers into BERT-layout names and map those."""
    kept, dropped = split_dropped(raw, "albert.", DROPPED_PREFIXES)
    bert_shapes = bert_layout_shapes(cfg, cfg.type_vocab_size)
    groups, inner = hf["num_hidden_groups"], hf["inner_group_num"]
    shapes = {n: s for n, s in bert_shapes.items() if not n.startswith(("encoder.layer.", "embeddings_project."))}
    shapes["encoder.embedding_hidden_mapping_in.weight"] = bert_shapes["embeddings_project.weight"]
    shapes["encoder.embedding_hidden_mapping_in.bias"] = bert_shapes["embeddings_project.bias"]
    for g in range(groups):
        for j in range(inner):
            for albert, bert in LAYER_NAMES.items():
                for kind in ("weight", "bias"):
                    shapes[f"encoder.albert_layer_groups.{g}.albert_layers.{j}.{albert}.{kind}"] = \
                        bert_shapes[f"encoder.layer.0.{bert}.{kind}"]
    check_tensors(kept, shapes, dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    layout = {n: t for n, t in kept.items() if not n.startswith("encoder.")}
    layout["embeddings_project.weight"] = kept["encoder.embedding_hidden_mapping_in.weight"]
    layout["embeddings_project.bias"] = kept["encoder.embedding_hidden_mapping_in.bias"]
    for block, source in enumerate(shared_layers(hf)):
        for albert, bert in LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                layout[f"encoder.layer.{block}.{bert}.{kind}"] = kept[f"{source}{albert}.{kind}"]
    return to_ortformer(layout, cfg), dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an ALBERT folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    # the layer sharing (groups, inner layers) is not an EncoderConfig field: the mapping reads it here
    hf = _settings(files.config)
    return import_folder(files, family="albert", build=albert_config,
                         map_weights=lambda raw, cfg, what, dup: map_weights(raw, cfg, what, dup, hf),
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("ALBERT", ("albert",), load,
                vocab_tokenizers={"albert": VocabTokenizer(albert_tokenizer, ("spiece.model",))})
