"""Import an ELECTRA encoder (the discriminator, or the generator's encoder) folder.

ELECTRA is BERT with embeddings E = embedding_size wide: LN_E(word + type + position),
then ``embeddings_project`` (a Linear E -> F) when E != F. That is EncoderConfig's
embedding_size; the layers and their weight names are BERT's under ``electra.``.
"""
from __future__ import annotations

from ....config import EncoderConfig
from ...loaded import Loaded
from ..bert_layout import bert_fields, check_bert_layout, map_bert_layout
from ..config_checks import make_config
from ..folder_import import import_folder
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import wordpiece_tokenizer

# task heads of ElectraFor... checkpoints
DROPPED_PREFIXES = ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.",
                    "classifier.", "qa_outputs.", "sequence_summary.")


def electra_config(hf: dict, common: dict) -> EncoderConfig:
    check_bert_layout(hf, "ELECTRA ")
    fields = bert_fields(hf)
    size = hf.get("embedding_size", 128)
    fields["embedding_size"] = 0 if size == hf["hidden_size"] else size
    return make_config("ELECTRA", **fields, **common)


def map_weights(raw, cfg: EncoderConfig, what: str, duplicates):
    return map_bert_layout(raw, cfg, what, duplicates, prefix="electra.", dropped_prefixes=DROPPED_PREFIXES)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an ELECTRA folder as an ortformer Encoder."""
    return import_folder(folder, family="electra", build=electra_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("ELECTRA", ("electra",), load,
                vocab_tokenizers={"electra": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",))})
