"""Import a BERT model from a local Hugging Face / sentence-transformers folder (the weight
layout it shares with other families: bert_layout.py).

A folder holds ``config.json`` (``model_type: bert``) and ``model.safetensors`` or
``pytorch_model.bin`` (read with weights_only=True). The Hugging Face BERT layer

    x = LN(x + O(softmax(Q K^T / sqrt(D) + mask) V));  x = LN(x + W2 act(W1 x))

with embeddings ``LN(word + token_type + position)`` is exactly ortformer's
post-norm softmax Encoder, so the import is a renaming plus one fusion: the
query, key and value Linears become one ``qkv`` Linear whose output rows are
``[Q; K; V]`` (MultiHeadAttention views them as (B, N, 3, H, D)).
"""
from __future__ import annotations

from ....config import EncoderConfig
from ...loaded import Loaded
from ..bert_layout import bert_fields, check_bert_layout, map_bert_layout
from ..family import Family, VocabTokenizer
from ..config_checks import make_config
from ..folder_import import import_folder
from ..vocab_tokenizers import wordpiece_tokenizer


def bert_config(hf: dict, common: dict | None = None) -> EncoderConfig:
    """EncoderConfig for a Hugging Face BERT config.json; CheckpointError for other variants."""
    model_type = hf.get("model_type")
    if model_type != "bert":
        from ...loading import unsupported_model_type

        raise unsupported_model_type(model_type)
    check_bert_layout(hf, "BERT ")
    return make_config("BERT", **bert_fields(hf), **{"name": "bert", **(common or {})})


def load_bert(folder, *, pooling: str | None = None, normalize: bool | None = None,
              name: str | None = None) -> Loaded:
    """Import a BERT folder as an ortformer Encoder (eval mode, float32).

    pooling / normalize: override the sentence-transformers config; without one
    the default is pooling="none" (BERT's own pooler head is not imported).
    """
    return import_folder(folder, family="bert", build=bert_config, map_weights=map_bert_layout,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("BERT", ("bert",), load_bert,
                vocab_tokenizers={"bert": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",))})
