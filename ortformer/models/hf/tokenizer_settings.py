"""What a folder's tokenizer_config.json and special_tokens_map.json say, for the builders of
tokenizer.json in vocab_tokenizers.py and spm_tokenizers.py."""
from __future__ import annotations

from pathlib import Path

from ...core.errors import CheckpointError
from .folder_layout import read_json


def token_text(value) -> str | None:
    """A special token as tokenizer configs write it: a string or {"content": string, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_settings(folder: Path, special_defaults: dict[str, str], flags: tuple[tuple[str, bool | None], ...]) -> dict:
    """tokenizer_config.json over special_tokens_map.json over transformers' defaults."""
    config, specials = {}, {}
    for name, into in (("special_tokens_map.json", specials), ("tokenizer_config.json", config)):
        if (folder / name).is_file():
            into.update(read_json(folder / name))
    settings = {key: token_text(config.get(key)) or token_text(specials.get(key)) or default
                for key, default in special_defaults.items()}
    for key, default in flags:
        value = config.get(key, default)
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: {key}={value!r} must be true, false or null")
        settings[key] = value
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, dict):
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: added_tokens_decoder must map ids to tokens, "
                              f"got {type(added).__name__}")
    settings["added"] = [(entry["content"], bool(entry.get("special")), bool(entry.get("normalized", False)))
                         for entry in added.values() if isinstance(entry, dict) and token_text(entry.get("content"))]
    special_texts = {settings[key] for key in special_defaults}
    settings["added"] += _legacy_added(folder, {c for c, _, _ in settings["added"]}, special_texts)
    # older saves (transformers < 4.34) list their extra special tokens only here
    extra = next((source[key] for source in (config, specials)
                  for key in ("additional_special_tokens", "extra_special_tokens") if source.get(key)), [])
    if not isinstance(extra, list):
        raise CheckpointError(f"{folder}: additional_special_tokens must be a list of tokens, got {type(extra).__name__}")
    settings["additional"] = [text for text in map(token_text, extra) if text]
    settings["config"] = config  # tokenizer_config.json as read, for family-specific keys
    return settings


def _legacy_added(folder: Path, known: set[str], specials: set) -> list[tuple[str, bool, bool]]:
    """added_tokens.json (transformers < 4.34: token -> id), in id order, as transformers reads it:
    special when it is one of the special tokens, else normalized."""
    path = folder / "added_tokens.json"
    if not path.is_file():
        return []
    tokens = read_json(path)
    if not isinstance(tokens, dict) or not all(isinstance(t, str) and isinstance(i, int) for t, i in tokens.items()):
        raise CheckpointError(f"{path} must map added tokens to integer ids")
    return [(t, t in specials, t not in specials) for t, _ in sorted(tokens.items(), key=lambda item: item[1])
            if t and t not in known]


# the order in which transformers appends special tokens that the vocabulary lacks
SPECIAL_ORDER = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def add_specials(tokenizer, s: dict, special_keys, vocab: dict[str, int]) -> None:
    """The special tokens present in the vocabulary, then the config's added tokens, then (new
    ids, in the order transformers gives them) the special tokens the vocabulary lacks and the
    additional special tokens."""
    from tokenizers import AddedToken

    specials = [s[k] for k in special_keys if s[k] in vocab] + [t for t in s["additional"] if t in vocab]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for content, special, normalized in s["added"]:
        if content not in specials:
            tokenizer.add_tokens([AddedToken(content, special=special, normalized=normalized)])
    added = {content for content, _, _ in s["added"]}
    missing = [s[k] for k in SPECIAL_ORDER if k in special_keys and s[k] not in vocab and s[k] not in added]
    missing += [t for t in s["additional"] if t not in vocab and t not in added]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(missing)])


def require_specials(folder: Path, s: dict, vocab: dict[str, int], keys=("unk_token", "cls_token", "sep_token")):
    missing = [s[k] for k in keys if s[k] not in vocab]
    if missing:
        raise CheckpointError(f"the vocabulary in {folder} lacks the special token(s) {missing} its tokenizer config names")


def cls_sep_template(cls: str, sep: str, ids: dict[str, int]):
    """BERT's post-processor: [CLS] $A [SEP], pairs [CLS] $A [SEP] $B:1 [SEP]:1 (DeBERTa's too)."""
    from tokenizers import processors

    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
