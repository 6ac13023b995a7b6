"""tokenizer.json for BERT-style folders saved with only ``vocab.txt`` (older transformers).

Runtime reads texts through the tokenizers library, which loads tokenizer.json only. A
WordPiece vocabulary plus tokenizer_config.json describe the same tokenizer completely:

    normalizer      BertNormalizer(clean_text, handle_chinese_chars = tokenize_chinese_chars,
                                   strip_accents, lowercase = do_lower_case)
    pre-tokenizer   BertPreTokenizer (whitespace and punctuation splits)
    model           WordPiece(vocab, unk_token, continuing prefix "##", 100 chars per word)
    post-processor  [CLS] $A [SEP]  (pairs: [CLS] $A [SEP] $B:1 [SEP]:1)

with transformers' defaults (do_lower_case true, strip_accents following it, Chinese
characters split) where the config is silent. The file is built once per folder into a
temporary folder that lives as long as the process, and export copies it beside the model.
"""
from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

from ...errors import CheckpointError
from .folder import read_json

FAMILIES = ("bert", "distilbert", "electra")  # WordPiece with [CLS] ... [SEP]
SPECIAL_DEFAULTS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]"}
_built: dict[str, Path] = {}  # digest of the files read -> the tokenizer.json built from them


def _text(value) -> str | None:
    """A special token as tokenizer configs write it: a string or {"content": string, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _settings(folder: Path) -> dict:
    """tokenizer_config.json over special_tokens_map.json over transformers' defaults."""
    config, specials = {}, {}
    for name, into in (("special_tokens_map.json", specials), ("tokenizer_config.json", config)):
        if (folder / name).is_file():
            into.update(read_json(folder / name))
    settings = {key: _text(config.get(key)) or _text(specials.get(key)) or default
                for key, default in SPECIAL_DEFAULTS.items()}
    for key, default in (("do_lower_case", True), ("tokenize_chinese_chars", True), ("strip_accents", None)):
        value = config.get(key, default)
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"{folder / 'tokenizer_config.json'}: {key}={value!r} must be true, false or null")
        settings[key] = value
    added = config.get("added_tokens_decoder") or {}
    settings["added"] = [(entry["content"], bool(entry.get("special")), bool(entry.get("normalized", False)))
                         for entry in added.values() if isinstance(entry, dict) and _text(entry.get("content"))]
    return settings


def wordpiece_tokenizer(folder: Path):
    """The tokenizers.Tokenizer that ``folder``'s vocab.txt and tokenizer_config.json describe."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    try:
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {folder / 'vocab.txt'}: {exc}") from None
    if lines and lines[-1] == "":
        lines.pop()  # the file's last newline ends the last token, it starts none
    vocab = {token.rstrip("\r"): index for index, token in enumerate(lines)}  # a repeated token keeps its last id
    s = _settings(folder)
    missing = [s[k] for k in ("unk_token", "cls_token", "sep_token") if s[k] not in vocab]
    if missing:
        raise CheckpointError(f"{folder / 'vocab.txt'} lacks the special token(s) {missing} its tokenizer config names")
    tokenizer = Tokenizer(WordPiece(vocab, unk_token=s["unk_token"], max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=s["tokenize_chinese_chars"],
                                                      strip_accents=s["strip_accents"], lowercase=s["do_lower_case"])
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    cls, sep = s["cls_token"], s["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    specials = [s[k] for k in SPECIAL_DEFAULTS if s[k] in vocab]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for content, special, normalized in s["added"]:
        if content not in specials:
            tokenizer.add_tokens([AddedToken(content, special=special, normalized=normalized)])
    return tokenizer


def built_tokenizer(model_dir: Path, root: Path, model_type: str) -> Path | None:
    """A tokenizer.json built from the folder's vocab.txt (see the module docstring) when the
    family is WordPiece and the tokenizers library is installed; None otherwise."""
    folder = next((d for d in (model_dir, root) if (d / "vocab.txt").is_file()), None)
    if model_type not in FAMILIES or folder is None:
        return None
    try:
        import tokenizers  # noqa: F401  the 'text' extra; without it the model takes token ids only
    except ImportError:
        return None
    digest = hashlib.sha256()
    try:
        for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            digest.update(name.encode() + ((folder / name).read_bytes() if (folder / name).is_file() else b"\0"))
    except OSError as exc:
        raise CheckpointError(f"cannot read the tokenizer files in {folder}: {exc.strerror or exc}") from None
    key = digest.hexdigest()  # an edited vocabulary or config builds anew
    if key not in _built or not _built[key].is_file():
        target = Path(tempfile.mkdtemp(prefix="ortformer-tokenizer-")) / "tokenizer.json"
        atexit.register(shutil.rmtree, target.parent, ignore_errors=True)
        wordpiece_tokenizer(folder).save(str(target))
        _built[key] = target
    return _built[key]
