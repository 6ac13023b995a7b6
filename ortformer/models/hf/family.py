"""One ``Family`` record per Hugging Face family module, and the registry that collects them.

Each module in FAMILY_MODULES declares ``FAMILY = Family(...)``; the registry's tables keyed by
model_type (loading's dispatch, its error messages) are derived from these records, so adding a
family is one module with one record and its entry in MAIN_MODEL_TYPES. Inside a family, code
may still branch on its own model_types (gemma's versions, rotary_bert's variants, heads.py's
activation key). The modules build torch encoders and are imported on first use, so this file
imports no family (and no torch) itself; the list of model_types (``model_types``: the export
--from help, loading's errors) comes from MAIN_MODEL_TYPES, the torch-free record of each
module's model_types, which ``families`` holds every module's FAMILY to.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ...core.errors import require_torch

# each family module of models/hf/families/ -> the config.json model_types its FAMILY imports as their
# main family (a variant, which keeps a main family's model_type and claims a folder by its detect,
# adds none), in the order the export --from help lists them; families() refuses a FAMILY that differs
MAIN_MODEL_TYPES: dict[str, tuple[str, ...]] = {
    "bert": ("bert",),
    "roberta": ("roberta", "xlm-roberta", "camembert", "data2vec-text"),
    "distilbert": ("distilbert",),
    "electra": ("electra",),
    "albert": ("albert",),
    "mpnet": ("mpnet",),
    "modernbert": ("modernbert", "modernbert-decoder"),
    "deberta": ("deberta",),
    "deberta_v2": ("deberta-v2",),
    "t5": ("t5", "mt5"),
    "ernie": ("ernie",),
    "roformer": ("roformer",),
    "longformer": ("longformer",),
    "prenorm_bert": ("xlm-roberta-xl", "megatron-bert", "esm", "roberta-prelayernorm"),
    "jina_bert": (),  # JinaBERT v2: a variant of "bert"
    "rotary_bert": ("nomic_bert", "gte", "new", "jina_embeddings_v3"),
    "llama": ("eurobert", "qwen3", "qwen2", "ultrabert", "mistral", "llama"),  # llama.FAMILIES' keys
    "gemma": ("gemma3_text", "gemma2", "gemma"),
    "neobert": ("neobert",),
    "lfm2": ("lfm2",),
    "jina_lora": (),  # Jina v3 with task adapters: a variant of "xlm-roberta"
    "jina_v5": ("jina_embeddings_v5",),
}
# the family modules, in the order the export --from help lists their model types
FAMILY_MODULES = tuple(MAIN_MODEL_TYPES)


@dataclass(frozen=True)
class VocabTokenizer:
    """build(folder) -> tokenizers.Tokenizer (or None for a kind it does not convert), from
    ``files`` (besides the tokenizer configs) in the folder."""
    build: Callable
    files: tuple[str, ...]


@dataclass(frozen=True)
class Family:
    """What one family module imports: its config.json model_types and the loader for them.

    load(files, pooling=, normalize=, name=) -> Loaded maps the weights and builds the Encoder.
    ``files`` is the folder as load_any read it (folder_files.FolderFiles: ``files.config`` is the
    parsed config.json, ``files.model_dir`` / ``files.root`` its places): a loader takes what it
    needs from it, never reads config.json again, and passes ``files`` on to import_folder.
    (FolderFiles.of(files) also takes a plain path, for a loader called directly.) ``detect``: the family is a variant of its model_types' main family (it
    keeps their model_type, e.g. JinaBERT v2's "bert") and claims a config.json when
    detect(config) holds. ``elsewhere``: model_types this family does not import, each with
    where to find the encoder it holds instead (quoted when one is refused). ``vocab_tokenizers``:
    the model_types whose older saves (a vocabulary, no tokenizer.json) ortformer can read texts for."""
    name: str
    model_types: tuple[str, ...]
    load: Callable
    detect: Callable[[dict], bool] | None = None
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    # model_type -> how a folder saved with only a vocabulary gets its tokenizer.json (vocab_tokenizers.py)
    vocab_tokenizers: Mapping[str, VocabTokenizer] = field(default_factory=dict)


@functools.cache
def families() -> tuple[Family, ...]:
    """Every module's FAMILY, in FAMILY_MODULES order; RuntimeError when two main families claim
    one model_type (a registry mistake, not a user's). The family modules build torch encoders,
    so this is where the registry needs torch (MissingExtraError without it). RuntimeError too
    when a module's main model_types are not the ones MAIN_MODEL_TYPES records for it."""
    require_torch("the Hugging Face family modules")
    records = tuple(importlib.import_module(f".families.{name}", __package__).FAMILY for name in FAMILY_MODULES)
    for name, record in zip(FAMILY_MODULES, records):
        main = () if record.detect is not None else tuple(record.model_types)
        if main != MAIN_MODEL_TYPES.get(name, ()):
            raise RuntimeError(f"family module {name!r} imports model_types {list(main)} as their main family, but "
                               f"MAIN_MODEL_TYPES records {list(MAIN_MODEL_TYPES.get(name, ()))} for it")
    claimed = [t for record in records if record.detect is None for t in record.model_types]
    repeated = sorted({t for t in claimed if claimed.count(t) > 1})
    if repeated:
        raise RuntimeError(f"model_types {repeated} are claimed by more than one family module")
    return records


@functools.cache
def by_model_type() -> dict[str, Family]:
    """model_type -> its main family (the one without ``detect``)."""
    return {t: record for record in families() if record.detect is None for t in record.model_types}


def model_types() -> tuple[str, ...]:
    """Every model_type ortformer imports, in FAMILY_MODULES order: read from MAIN_MODEL_TYPES,
    so listing them imports no family module and needs no torch."""
    return tuple(dict.fromkeys(t for name in FAMILY_MODULES for t in MAIN_MODEL_TYPES.get(name, ())))


def family_for(config: dict) -> Family | None:
    """The family that imports a folder with this config.json: a variant whose detect(config)
    holds, else the model_type's main family; None for an unsupported model_type."""
    model_type = config.get("model_type")
    variant = next((r for r in families() if r.detect is not None and model_type in r.model_types
                    and r.detect(config)), None)
    return variant or by_model_type().get(model_type)


def elsewhere_hint(model_type) -> str:
    """Where the encoder of an unsupported ``model_type`` is imported from, or ''."""
    return next((r.elsewhere[model_type] for r in families() if model_type in r.elsewhere), "")
