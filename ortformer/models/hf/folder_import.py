"""``import_folder``: the import every family module's loader runs. Family-specific weight
mapping lives beside this file (one module per family)."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

from ...config import SPLADE_POOLINGS, EncoderConfig
from ...core.errors import CheckpointError
from ..loaded import Loaded
from ..weights import Tensors, encoder_from_tensors, find_weights, read_weights, weights_source
from .folder_files import FolderFiles
from .folder_layout import HF_DTYPES, HF_WEIGHT_NAMES, folder_name
from .heads import classifier_head, mlm_head, mlm_inputs, tie_decoder
from .late_folders import TokenHeads, bge_m3_heads, colbert_ai_heads, st_token_heads
from .sentence_dense import dense_tensors


log = logging.getLogger(__name__)
MapWeights = Callable[[Tensors, EncoderConfig, str, list], tuple[Tensors, list[str]]]


def import_folder(folder, *, family: str, build: Callable[[dict, dict], EncoderConfig], map_weights: MapWeights,
                  pooling: str | None = None, normalize: bool | None = None, name: str | None = None,
                  reranker=None) -> Loaded:
    """Import a Hugging Face folder (with or without a sentence-transformers layout).

    folder: the FolderFiles a family's load was handed (its files already parsed), or a path
    (read here).

    build(hf_config, common) -> EncoderConfig, where common holds pooling,
    normalize_embeddings and name; map_weights(tensors, cfg, what, duplicates) ->
    (ortformer-named tensors, dropped names), checking what it maps.
    pooling / normalize override the sentence-transformers config; without one the
    default is pooling="none" (a base model's pooler is not imported). A classifier's head
    (config.json's architectures, heads.py) becomes the logits output; an LLM reranker's
    (``reranker``, llm_reranker.RerankerHead) the one-label z_yes - z_no head.
    """
    files = FolderFiles.of(folder)
    root, model_dir, hf_config, st = files.root, files.model_dir, files.config, files.sentence
    pooling = pooling or st.pooling or "none"
    if normalize is None:  # a Normalize module means nothing without a pooled embedding
        normalize = st.normalize and pooling != "none"
    # a Dense head maps the pooled vector: without a pooling (pooling="none") it has nothing to map
    dense = st.dense if st.dense is not None and pooling != "none" else None
    # a fine-tuned classifier (config.json's architectures) keeps its head as the logits output,
    # unless a sentence-transformers Pooling module embeds with the base model (AutoModel: the head
    # is never run there); SPLADE pools the masked-LM head's logits
    sparse = pooling in SPLADE_POOLINGS
    model_type = hf_config.get("model_type")
    if sparse:
        classifier = mlm_head(hf_config, model_type, str(model_dir))
    elif reranker is not None:
        classifier = reranker.classifier
    else:
        classifier = None if st.pooling is not None else classifier_head(hf_config, model_type, str(model_dir))
    common = {"pooling": pooling, "normalize_embeddings": normalize, "name": name or folder_name(root),
              **(dense.fields() if dense else {}), **(classifier.fields() if classifier else {}),
              **({"splade_activation": st.splade_activation} if sparse else {})}
    cfg = build(hf_config, common)
    # sentence-transformers truncates sentence embeddings only (a SPLADE model's are vocabulary weights);
    # a truncate_dim at or past the width keeps them whole, as its slice does
    if st.truncate_dim and pooling != "none" and not sparse and st.truncate_dim < cfg.sentence_size:
        cfg = cfg.replace(truncate_dim=st.truncate_dim)
    heads = _token_heads(root, st, cfg.hidden_size)
    weights = find_weights(model_dir, HF_WEIGHT_NAMES, sharded=True)
    raw, _, duplicates = read_weights(weights)
    raw = legacy_names(raw, str(weights))
    if reranker is not None:
        raw = reranker.tensors(raw, str(weights))
    if heads is None:  # colbert-ai keeps its projection among the encoder's weights
        heads = colbert_ai_heads(root, hf_config, raw, str(weights))
    if heads is not None:
        cfg = cfg.replace(**heads.fields)
        _check_expansion(heads.spec, cfg, root)
        raw = {k: v for k, v in raw.items() if k not in heads.consumed}
    mapped, dropped = map_weights(raw, cfg, str(weights), duplicates)
    if classifier is not None:
        head_raw, aliased = mlm_inputs(classifier, raw, mapped.get("tokens.weight")) if sparse else (raw, set())
        head_tensors, used = classifier.tensors(head_raw, cfg.hidden_size, cfg.bias, str(weights))
        mapped, dropped = {**mapped, **head_tensors}, [d for d in dropped if d not in used | aliased]
    if dropped:
        log.info("not imported from %s (unused by an encoder): %s", weights, ", ".join(dropped))
    sources = [weights]
    if dense is not None:
        head, dense_files = dense_tensors(dense, cfg.hidden_size)
        mapped, sources = {**mapped, **head}, [weights, *dense_files]
    if heads is not None:
        mapped, sources = {**mapped, **heads.tensors}, [*sources, *heads.files]
    model = encoder_from_tensors(cfg, mapped, what=f"{weights} (mapped)", dtypes=HF_DTYPES)
    if sparse:
        tie_decoder(model)
    # sentence-transformers truncates at the smaller of max_seq_length and what the model takes
    max_len = min(st.max_seq_length, cfg.max_sequence) if st.max_seq_length else None
    return Loaded(model, weights_source(*sources), files.tokenizer, max_len, st.lowercase,
                  weights=weights, dropped=tuple(dropped), family=family, prompts=dict(st.prompts),
                  default_prompt=st.default_prompt, labels=classifier.labels if classifier else (),
                  late_spec=dataclasses.replace(heads.spec, folder=model_dir) if heads else None,
                  rerank=reranker.template if reranker is not None else None, folder=files)


# transformers' "legacy" renaming, applied to every model's keys when it loads a checkpoint: TF-era
# saves (and folders re-saved from them, SPLADE heads included) name LayerNorm parameters gamma / beta
LEGACY_NAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def legacy_names(raw: Tensors, what: str) -> Tensors:
    """``raw`` with the legacy parameter names renamed as transformers renames them on load, so
    every family's encoder and head mapping reads one spelling; a name saved both ways is refused."""
    renamed = {}
    for name, tensor in raw.items():
        new = name
        for old, current in LEGACY_NAMES:
            new = new.replace(old, current)
        if new != name and new in raw:
            raise CheckpointError(f"{what} holds both {name} and {new}: one parameter saved under its legacy "
                                  "and its current name; keep one")
        renamed[new] = tensor
    return renamed


def _token_heads(root: Path, st, hidden: int) -> TokenHeads | None:
    """The per-token heads of a multi-vector sentence-transformers / PyLate folder or of bge-m3
    (colbert-ai's are found among the weights, later)."""
    if st.token_dense is not None:
        return st_token_heads(root, st.token_dense, hidden)
    return bge_m3_heads(root, hidden)


def _check_expansion(spec, cfg: EncoderConfig, root: Path) -> None:
    """Query expansion tokens hidden from attention keep outputs at positions the attention mask
    marks as padding; a model whose position ids count kept tokens (RoBERTa's, from the mask)
    would give them the last kept token's position, where the source counts them."""
    if spec.expansion and not spec.attend_to_expansion and cfg.position_ids == "kept":
        raise CheckpointError(f"{root}: query expansion without attention to the expansion tokens is not "
                              "supported for a model whose position ids count kept tokens (RoBERTa / XLM-R "
                              "families); ortformer imports it for BERT-like position ids, or with "
                              "attend_to_expansion_tokens=true")
