"""Import RoBERTa, XLM-RoBERTa, CamemBERT and data2vec-text folders (one architecture, four model_types).

The layers are BERT's (same weight names under a ``roberta.`` prefix); the embeddings
differ in two ways, both expressed as EncoderConfig fields:

- positions: ``create_position_ids_from_input_ids`` gives kept token k (1-based) the row
  padding_idx + k and skips padding, i.e. position_offset = pad_token_id + 1 with
  position_ids="kept". ortformer counts kept tokens from attention_mask instead of
  input_ids != pad_token_id: the same rows whenever padding is masked, which is what a
  tokenizer produces (a kept token that happens to be the pad id would differ);
- a single token type (type_vocab_size 1): its one vector is added to every token, so it
  is folded into the position table and the model takes no token_type_ids.
"""
from __future__ import annotations

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ..bert_layout import bert_fields, check_bert_layout, map_bert_layout
from ..config_checks import make_config
from ..folder_import import import_folder
from ..family import Family, VocabTokenizer
from ..spm_tokenizers import camembert_tokenizer, xlm_roberta_tokenizer
from ..vocab_tokenizers import byte_bpe_tokenizer

MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "data2vec-text")
# task heads of RobertaFor... checkpoints
DROPPED_PREFIXES = ("pooler.", "lm_head.", "classifier.", "qa_outputs.")


def roberta_config(hf: dict, common: dict) -> EncoderConfig:
    what = f"{hf.get('model_type')} "
    return make_config(what.strip(), **roberta_fields(hf, what), **common)


def roberta_fields(hf: dict, what: str) -> dict:
    """EncoderConfig fields of RoBERTa's layout: BERT's, with RoBERTa's positions and types."""
    check_bert_layout(hf, what)
    pad = hf.get("pad_token_id", 1)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise CheckpointError(f"{what}config.json pad_token_id={pad!r} is not supported; "
                              "RoBERTa positions start at pad_token_id + 1, so it must be an int >= 0")
    fields = bert_fields(hf)
    types = hf.get("type_vocab_size", 2)
    if isinstance(types, bool) or not isinstance(types, int) or types < 1:
        raise CheckpointError(f"{what}config.json type_vocab_size={types!r} is not supported; it must be an int >= 1")
    fields.update(position_offset=pad + 1, position_ids="kept", type_vocab_size=0 if types == 1 else types)
    return fields


def map_weights(raw, cfg: EncoderConfig, what: str, duplicates):
    # type_vocab_size 0 in the config means the file's single type row was folded
    return map_bert_layout(raw, cfg, what, duplicates, prefix=("roberta.", "data2vec_text."), dropped_prefixes=DROPPED_PREFIXES,
                           hf_types=cfg.type_vocab_size or 1)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a RoBERTa / XLM-RoBERTa / CamemBERT / data2vec-text folder as an ortformer Encoder."""
    return import_folder(folder, family="roberta", build=roberta_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("RoBERTa", ("roberta", "xlm-roberta", "camembert", "data2vec-text"), load,
                vocab_tokenizers={"roberta": VocabTokenizer(byte_bpe_tokenizer, ("vocab.json", "merges.txt")),
                                  "xlm-roberta": VocabTokenizer(xlm_roberta_tokenizer, ("sentencepiece.bpe.model",)),
                                  "camembert": VocabTokenizer(camembert_tokenizer, ("sentencepiece.bpe.model",)),
                                  "data2vec-text": VocabTokenizer(byte_bpe_tokenizer, ("vocab.json", "merges.txt"))})
