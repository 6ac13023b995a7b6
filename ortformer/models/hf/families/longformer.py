"""Import Longformer folders (``longformer``): RoBERTa's layers with sliding-window attention.

transformers' LongformerModel without a global_attention_mask (what sentence-transformers and
LongformerModel callers that pass none run): every layer attends to |i - j| <= attention_window / 2,
which is ortformer's local_attention group with ``window = attention_window`` and no global layer
(global_every past the last layer). The embeddings and positions are RoBERTa's (roberta.py). The global projections
(query_global, key_global, value_global) act only on tokens given global attention, so they are
set aside. LongformerForSequenceClassification gives its first token global attention whatever
the caller passes, which ortformer does not implement: such folders are refused, as are question
answering and multiple choice ones (their encoders run with global attention on the question
tokens), unless a sentence-transformers layout embeds with the base model (heads.py); a token
classifier's head (one Linear per token, no global attention) is kept.
"""
from __future__ import annotations

from ....config import EncoderConfig, LocalAttention
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ..bert_layout import map_bert_layout
from ..config_checks import make_config, make_group
from ..folder_import import import_folder
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import byte_bpe_tokenizer
from .roberta import DROPPED_PREFIXES, roberta_fields

WHAT = "Longformer "
GLOBAL_PROJECTIONS = ("query_global", "key_global", "value_global")


def window(hf: dict) -> int:
    """attention_window as one local_attention window: an even int >= 2, the same for every layer."""
    layers, value = hf["num_hidden_layers"], hf.get("attention_window", 512)
    windows = value if isinstance(value, list) else [value] * layers
    if len(windows) != layers or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 2 and w % 2 == 0
                                         for w in windows):
        raise CheckpointError(f"{WHAT}config.json attention_window={value!r} is not supported; it must be an even "
                              f"int >= 2, or a list of {layers} of them")
    if len(set(windows)) > 1:
        raise CheckpointError(f"{WHAT}config.json attention_window={value!r} gives layers different windows; "
                              "ortformer implements one window for every layer")
    return windows[0]


def longformer_config(hf: dict, common: dict) -> EncoderConfig:
    layers, fields = hf["num_hidden_layers"], roberta_fields(hf, WHAT)
    # every layer local: the global one of each group of layers + 1 sits past the last layer
    local = make_group(WHAT.strip(), LocalAttention, window=window(hf), global_every=layers + 1, global_offset=layers)
    return make_config(WHAT.strip(), **fields, local_attention=local, **common)


def map_weights(raw, cfg: EncoderConfig, what: str, duplicates):
    global_names = [n for n in raw if n.split(".")[-2] in GLOBAL_PROJECTIONS]
    mapped, dropped = map_bert_layout({n: t for n, t in raw.items() if n not in global_names}, cfg, what, duplicates,
                                      prefix="longformer.", dropped_prefixes=DROPPED_PREFIXES,
                                      hf_types=cfg.type_vocab_size or 1)
    return mapped, sorted(dropped + global_names)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a Longformer folder as an ortformer Encoder."""
    return import_folder(folder, family="longformer", build=longformer_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("Longformer", ("longformer",), load,
                vocab_tokenizers={"longformer": VocabTokenizer(byte_bpe_tokenizer, ("vocab.json", "merges.txt"))})
