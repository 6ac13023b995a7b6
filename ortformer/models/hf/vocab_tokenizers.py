"""tokenizer.json for folders saved with only a vocabulary (older transformers, or a
sentencepiece model: spm_tokenizers.py).

Runtime reads texts through the tokenizers library, which loads tokenizer.json only. A
vocabulary plus tokenizer_config.json describe the same tokenizer completely:

BERT, DistilBERT, ELECTRA (``vocab.txt``):
    normalizer      BertNormalizer(clean_text, handle_chinese_chars = tokenize_chinese_chars,
                                   strip_accents, lowercase = do_lower_case)
    pre-tokenizer   BertPreTokenizer (whitespace and punctuation splits)
    model           WordPiece(vocab, unk_token, continuing prefix "##", 100 chars per word)
    post-processor  [CLS] $A [SEP]  (pairs: [CLS] $A [SEP] $B:1 [SEP]:1)
RoBERTa (``vocab.json`` + ``merges.txt``):
    pre-tokenizer   ByteLevel(add_prefix_space), no normalizer
    model           BPE(vocab, merges), no subword prefix or suffix
    post-processor  <s> $A </s>  (RobertaProcessing, offsets trimmed)
DeBERTa v1 (``vocab.json`` + ``merges.txt``): RoBERTa's byte-level BPE with BERT's specials
    and post-processor ([CLS] $A [SEP], pairs with token types).
ESM (``vocab.txt``): see esm_tokenizer.

with transformers' defaults where the config is silent. The file is built once per set of
inputs into a temporary folder that lives as long as the process; export copies it beside
the model.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from ...core.errors import CheckpointError
from .family import by_model_type
from .folder_layout import read_json
from .tokenizer_settings import add_specials, cls_sep_template, read_settings, require_specials

WORDPIECE_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                      "mask_token": "[MASK]"}
ROBERTA_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>",
                    "mask_token": "<mask>"}
ESM_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<cls>", "eos_token": "<eos>",
                "mask_token": "<mask>"}
DEBERTA_SPECIALS = {"bos_token": "[CLS]", "eos_token": "[SEP]", **WORDPIECE_SPECIALS}
_built: dict[str, Path] = {}  # digest of the files read -> the tokenizer.json built from them


def read_vocab_txt(folder: Path) -> dict[str, int]:
    """vocab.txt: one token a line, its id the line number (a repeated token keeps its last id)."""
    try:
        lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {folder / 'vocab.txt'}: {exc}") from None
    if lines and lines[-1] == "":
        lines.pop()  # the file's last newline ends the last token, it starts none
    return {token.rstrip("\r"): index for index, token in enumerate(lines)}


def esm_tokenizer(folder: Path):
    """ESM's tokenizer: every vocabulary entry is matched wherever it occurs in the text (longest
    first), what lies between is split at whitespace and each piece is one token or <unk>;
    <cls> $A <eos>, pairs <cls> $A <eos> $B <eos> (EsmTokenizer)."""
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = read_vocab_txt(folder)
    s = read_settings(folder, ESM_SPECIALS, ())
    require_specials(folder, s, vocab, ("unk_token", "cls_token", "eos_token"))
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=s["unk_token"]))
    # Python's str.split() also splits at the information separators U+001C..U+001F, which are
    # not Unicode White_Space (WhitespaceSplit's): turn them into spaces first
    tokenizer.normalizer = normalizers.Replace(Regex("[\x1c-\x1f]"), " ")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = {s[key] for key in ESM_SPECIALS}
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in vocab if t not in special])
    cls, eos = s["cls_token"], s["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {eos}", pair=f"{cls} $A {eos} $B {eos}", special_tokens=[(cls, vocab[cls]), (eos, vocab[eos])])
    add_specials(tokenizer, s, ESM_SPECIALS, vocab)
    return tokenizer


def wordpiece_tokenizer(folder: Path):
    """The tokenizers.Tokenizer that ``folder``'s vocab.txt and tokenizer_config.json describe."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    vocab = read_vocab_txt(folder)
    s = read_settings(folder, WORDPIECE_SPECIALS,
                  (("do_lower_case", True), ("tokenize_chinese_chars", True), ("strip_accents", None)))
    require_specials(folder, s, vocab)
    tokenizer = Tokenizer(WordPiece(vocab, unk_token=s["unk_token"], max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=s["tokenize_chinese_chars"],
                                                      strip_accents=s["strip_accents"], lowercase=s["do_lower_case"])
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.post_processor = cls_sep_template(s["cls_token"], s["sep_token"], vocab)
    add_specials(tokenizer, s, WORDPIECE_SPECIALS, vocab)
    return tokenizer


def byte_bpe_tokenizer(folder: Path, specials: dict[str, str] = ROBERTA_SPECIALS):
    """The tokenizers.Tokenizer that ``folder``'s vocab.json, merges.txt and tokenizer_config.json
    describe: RoBERTa's, or with DEBERTA_SPECIALS DeBERTa v1's ([CLS] $A [SEP] post-processor)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab = read_json(folder / "vocab.json")
    if not all(isinstance(v, int) for v in vocab.values()):
        raise CheckpointError(f"{folder / 'vocab.json'} must map tokens to integer ids")
    try:
        lines = (folder / "merges.txt").read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {folder / 'merges.txt'}: {exc}") from None
    # "#version: ..." heads the file; every other line is one merge "a b"
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    bad = [i for i, m in enumerate(merges) if len(m) != 2]
    if bad:
        raise CheckpointError(f"{folder / 'merges.txt'}: {len(bad)} line(s) are not a merge 'a b' (first: {merges[bad[0]]!r})")
    s = read_settings(folder, specials, (("add_prefix_space", False), ("trim_offsets", True)))
    require_specials(folder, s, vocab, ("cls_token", "sep_token"))
    tokenizer = Tokenizer(BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=s["add_prefix_space"])
    tokenizer.decoder = decoders.ByteLevel()
    if specials is ROBERTA_SPECIALS:
        tokenizer.post_processor = processors.RobertaProcessing(
            (s["sep_token"], vocab[s["sep_token"]]), (s["cls_token"], vocab[s["cls_token"]]),
            trim_offsets=s["trim_offsets"], add_prefix_space=s["add_prefix_space"])
    else:
        tokenizer.post_processor = cls_sep_template(s["cls_token"], s["sep_token"], vocab)
    add_specials(tokenizer, s, specials, vocab)
    return tokenizer


def deberta_v1_tokenizer(folder: Path):
    """DeBERTa v1's tokenizer: RoBERTa's byte-level BPE with BERT's specials and post-processor."""
    return byte_bpe_tokenizer(folder, DEBERTA_SPECIALS)


def built_tokenizer(model_dir: Path, root: Path, model_type: str) -> Path | None:
    """A tokenizer.json built from the folder's vocabulary (see the module docstrings) for the
    model types whose Family record names a VocabTokenizer, when the tokenizers library is
    installed; None otherwise, and for a BPE-type sentencepiece model."""
    family = by_model_type().get(model_type)
    spec = family.vocab_tokenizers.get(model_type) if family else None
    build, needed = (spec.build, spec.files) if spec else (None, ())
    folder = next((d for d in (model_dir, root) if needed and all((d / n).is_file() for n in needed)), None)
    if folder is None:
        return None
    try:
        import tokenizers  # noqa: F401  the 'text' extra; without it the model takes token ids only
    except ImportError:
        return None
    digest = hashlib.sha256()
    try:
        for name in (*needed, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
            digest.update(name.encode() + ((folder / name).read_bytes() if (folder / name).is_file() else b"\0"))
    except OSError as exc:
        raise CheckpointError(f"cannot read the tokenizer files in {folder}: {exc.strerror or exc}") from None
    key = digest.hexdigest()  # an edited vocabulary or config builds anew
    if key not in _built or not _built[key].is_file():
        try:
            tokenizer = build(folder)
        except CheckpointError:
            raise
        except Exception as exc:  # the tokenizers library refuses what it was given (e.g. a corrupt charsmap)
            raise CheckpointError(f"cannot build a tokenizer from the files in {folder}: {exc}") from None
        if tokenizer is None:  # a kind the builders do not convert: the model takes token ids
            return None
        _built[key] = saved_for_process(tokenizer)
    return _built[key]


def saved_for_process(tokenizer) -> Path:
    """``tokenizer`` saved as tokenizer.json in a temporary folder that lives as long as the process."""
    target = Path(tempfile.mkdtemp(prefix="ortformer-tokenizer-")) / "tokenizer.json"
    atexit.register(shutil.rmtree, target.parent, ignore_errors=True)
    tokenizer.save(str(target))
    return target


def as_transformers_reads(tokenizer_path: Path, model_dir: Path, root: Path) -> Path:
    """``tokenizer_path``, or a copy that reads texts as transformers does by the folder's
    tokenizer_config.json, where tokenizer.json alone would read them otherwise (TextEncoder reads
    both from the file, so no metadata key is needed):

    - ``truncation_side: "left"`` keeps a long text's end: truncation direction "left";
    - ``model_input_names`` without "token_type_ids": transformers (and sentence-transformers'
      CrossEncoder) then feed the model no token types, so it sees type 0 for both texts of a
      pair: every pair template's type ids become 0.
    """
    config = next((d / "tokenizer_config.json" for d in (tokenizer_path.parent, model_dir, root)
                   if (d / "tokenizer_config.json").is_file()), None)
    settings = read_json(config) if config else {}
    side = settings.get("truncation_side", "right")
    if side not in ("left", "right"):
        raise CheckpointError(f"{config}: truncation_side={side!r}; valid: 'left' or 'right'")
    names = settings.get("model_input_names")
    untyped = isinstance(names, list) and "token_type_ids" not in names
    if side == "right" and not untyped:
        return tokenizer_path
    try:
        from tokenizers import Tokenizer
    except ImportError:  # the 'text' extra: without it the model takes token ids, and export says so
        return tokenizer_path
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        if untyped and tokenizer.post_processor is not None:
            data = json.loads(tokenizer.to_str())
            data["post_processor"] = _untyped_pairs(data["post_processor"])
            tokenizer = Tokenizer.from_str(json.dumps(data))
    except Exception as exc:  # the tokenizers library refuses the file: as built_tokenizer reports it
        raise CheckpointError(f"cannot read the tokenizer {tokenizer_path}: {exc}") from None
    if side == "left":
        tokenizer.enable_truncation(max_length=(tokenizer.truncation or {}).get("max_length", 512), direction="left")
    return saved_for_process(tokenizer)


def _untyped_pairs(processor: dict | None) -> dict | None:
    """A post-processor (tokenizer.json form) whose pair template gives every token type 0."""
    if not processor:
        return processor
    kind = processor.get("type")
    if kind == "Sequence":
        return {**processor, "processors": [_untyped_pairs(p) for p in processor["processors"]]}
    if kind == "BertProcessing":  # [CLS] $A [SEP] $B:1 [SEP]:1, as a template with type 0 throughout
        (sep, sep_id), (cls, cls_id) = processor["sep"], processor["cls"]
        a, b, c, s = _piece("Sequence", "A"), _piece("Sequence", "B"), _piece("SpecialToken", cls), _piece("SpecialToken", sep)
        processor = {"type": "TemplateProcessing", "single": [c, a, s], "pair": [c, a, s, b, s],
                     "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in ((cls, cls_id), (sep, sep_id))}}
    if processor.get("type") == "TemplateProcessing":
        for piece in processor["pair"]:
            next(iter(piece.values()))["type_id"] = 0
    return processor  # RobertaProcessing and the rest give no second type


def _piece(kind: str, name: str) -> dict:
    """One item of a TemplateProcessing template (tokenizer.json form), of type 0."""
    return {kind: {"id": name, "type_id": 0}}
