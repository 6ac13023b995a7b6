"""tokenizer.json for folders that hold only a sentencepiece model (DeBERTa-v3, XLM-R, CamemBERT,
ALBERT, T5).

The ``.model`` file is a protobuf ``ModelProto``; only a handful of its fields describe the
tokenizer, so they are read straight from the wire format (no generated protobuf code, whose
gencode/runtime version pairing breaks between releases). The tokenizer built from them is the
one transformers builds for the same folder:

DeBERTa-v2/v3 (``spm.model``):
    normalizer      [Lowercase if do_lower_case] the precompiled character map, strip right, runs
                    of spaces -> " " (without a map: runs of whitespace -> " ", NFC, strip right)
    pre-tokenizer   [Punctuation if split_by_punct] Metaspace(prepend always | first)
    model           Unigram(pieces, unk = unk_token's piece)
    post-processor  [CLS] $A [SEP]
XLM-R (``sentencepiece.bpe.model``):
    vocabulary      <s> <pad> </s> <unk>, the pieces after the model's first three, <mask>
    normalizer      the model's precompiled character map
    pre-tokenizer   WhitespaceSplit, Metaspace
    post-processor  <s> $A </s>
CamemBERT (``sentencepiece.bpe.model``):
    vocabulary      <s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED, the pieces after the model's
                    first, <mask>
    normalizer, pre-tokenizer, post-processor as XLM-R's
ALBERT (``spiece.model``):
    normalizer      `` and '' -> ", [NFKD, strip accents unless keep_accents] [Lowercase if
                    do_lower_case], the precompiled character map
    pre-tokenizer   WhitespaceSplit, Metaspace
    post-processor  [CLS] $A [SEP], pairs [CLS] $A [SEP] $B:1 [SEP]:1
T5 / mT5 (``spiece.model``):
    vocabulary      the pieces, then <extra_id_{extra_ids - 1}> ... <extra_id_0>
    normalizer      the model's precompiled character map
    pre-tokenizer   WhitespaceSplit, Metaspace
    post-processor  $A </s>

DeBERTa, CamemBERT, ALBERT and T5: control pieces are special tokens (XLM-R: not); user-defined pieces
stay in the unigram model, which matches them whole, as sentencepiece and transformers (5.25 on) have them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import CheckpointError
from .tokenizer_settings import add_specials, cls_sep_template, read_settings, require_specials

MAX_EXTRA_IDS = 10_000  # T5 ships 100 sentinels; a config asking for millions is broken
CONTROL = 3  # a sentencepiece piece type (1 normal, 2 unknown, 4 user-defined, 5 unused, 6 byte)
UNIGRAM = 1


@dataclass
class SpmModel:
    """The parts of a sentencepiece ModelProto that define its tokenizer."""
    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # (piece, score, type), by id
    model_type: int = UNIGRAM
    unk_id: int = 0  # the trainer's unknown-piece id
    charsmap: bytes = b""  # the normalizer's precompiled character map


def _wire(buf: bytes):
    """(field number, value) of one protobuf message: varints as int, length-delimited as bytes,
    fixed32 as float."""
    pos, end = 0, len(buf)

    def varint():
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while pos < end:
        key = varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            yield number, varint()
        elif kind == 2:
            size = varint()
            if pos + size > end:
                raise ValueError("truncated field")
            yield number, buf[pos:pos + size]
            pos += size
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            if pos + width > end:
                raise ValueError("truncated field")
            yield number, (struct.unpack_from("<f", buf, pos)[0] if width == 4 else None)
            pos += width
        else:
            raise ValueError(f"wire type {kind}")


def read_spm(path: Path) -> SpmModel:
    """The pieces, model type, unknown id and character map of the sentencepiece model at ``path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    model = SpmModel()
    try:
        for number, value in _wire(data):
            if number == 1 and isinstance(value, bytes):  # pieces
                piece, score, kind = None, 0.0, 1
                for n, v in _wire(value):
                    if n == 1 and isinstance(v, bytes):
                        piece = v.decode("utf-8")
                    elif n == 2 and isinstance(v, float):
                        score = v
                    elif n == 3 and isinstance(v, int):
                        kind = v
                if piece is None:
                    raise ValueError(f"piece {len(model.pieces)} has no text")
                model.pieces.append((piece, score, kind))
            elif number == 2 and isinstance(value, bytes):  # trainer_spec
                spec = [(n, v) for n, v in _wire(value) if isinstance(v, int)]
                model.model_type = next((v for n, v in spec if n == 3), UNIGRAM)
                unk = next((v for n, v in spec if n == 40), 0)
                model.unk_id = unk - (1 << 64) if unk >= 1 << 63 else unk  # int32 on the wire as 64 bits
            elif number == 3 and isinstance(value, bytes):  # normalizer_spec
                model.charsmap = next((v for n, v in _wire(value) if n == 2 and isinstance(v, bytes)), b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not a sentencepiece model ({exc})") from None
    if not model.pieces:
        raise CheckpointError(f"{path} is not a sentencepiece model (it holds no pieces)")
    return model


def _unigram_model(path: Path) -> SpmModel | None:
    """The model at ``path``, or None for a BPE-type one (export then notes that texts need a
    tokenizer.json)."""
    model = read_spm(path)
    return model if model.model_type == UNIGRAM else None


def _pieces_and_settings(path: Path, specials: dict[str, str], flags):
    """(model, settings, vocabulary as (piece, score) by id, id by piece) of a tokenizer whose
    ids are the model's own, its [CLS]/[SEP]/unknown specials checked to be pieces; None for a
    BPE-type model."""
    model = _unigram_model(path)
    if model is None:
        return None
    s = read_settings(path.parent, specials, flags)
    vocab = [(piece, score) for piece, score, _ in model.pieces]
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    require_specials(path.parent, s, ids)
    return model, s, vocab, ids


def _unigram(vocab: list[tuple[str, float]], unk_id: int, path: Path):
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram

    if not 0 <= unk_id < len(vocab):
        raise CheckpointError(f"{path}: the unknown piece's id {unk_id} is outside its {len(vocab)} pieces")
    return Tokenizer(Unigram(vocab, unk_id=unk_id, byte_fallback=False))


def _piece_tokens(tokenizer, model: SpmModel) -> None:
    """Control pieces match as unnormalized special tokens. User-defined pieces stay in the unigram
    model, which emits them whole as sentencepiece does: as added tokens they would split the text
    and restart the "▁" prefix after them."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(piece, special=True, normalized=False)
                                  for piece, _, kind in model.pieces if kind == CONTROL])


def _metaspace(prepend: str):
    from tokenizers import decoders, pre_tokenizers

    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend), \
        decoders.Metaspace(replacement="▁", prepend_scheme=prepend)


def _charsmap_and_words(tokenizer, model: SpmModel, prepend: str, first=()) -> None:
    """XLM-R's, CamemBERT's, ALBERT's and T5's front end: the model's precompiled character map
    (after ``first``, ALBERT's own normalizers), then words split at whitespace, each marked with
    "▁" (Metaspace)."""
    from tokenizers import normalizers, pre_tokenizers

    charsmap = [normalizers.Precompiled(model.charsmap)] if model.charsmap else []
    if first:
        tokenizer.normalizer = normalizers.Sequence([*first, *charsmap])
    else:
        tokenizer.normalizer = charsmap[0] if charsmap else None
    metaspace, tokenizer.decoder = _metaspace(prepend)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])


DEBERTA_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]"}
XLMR_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                 "mask_token": "<mask>"}
ALBERT_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "[CLS]", "eos_token": "[SEP]",
                   "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
T5_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}


def deberta_tokenizer(folder: Path):
    """The tokenizers.Tokenizer transformers builds from a DeBERTa-v2/v3 folder's spm.model."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    path = folder / "spm.model"
    read = _pieces_and_settings(path, DEBERTA_SPECIALS,
                                (("do_lower_case", False), ("split_by_punct", False), ("add_prefix_space", True)))
    if read is None:
        return None
    model, s, vocab, ids = read
    # transformers looks the unknown piece up by its token and a score of 0, else takes the trainer's
    unk_id = vocab.index((s["unk_token"], 0.0)) if (s["unk_token"], 0.0) in vocab else model.unk_id
    tokenizer = _unigram(vocab, unk_id, path)
    steps = [normalizers.Lowercase()] if s["do_lower_case"] else []
    if model.charsmap:  # the trainer's normalization (nmt_nfkc unless told otherwise), as sentencepiece runs it
        steps += [normalizers.Precompiled(model.charsmap), normalizers.Strip(left=False, right=True),
                  normalizers.Replace(Regex(r" {2,}"), " ")]
    else:
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
    tokenizer.normalizer = normalizers.Sequence(steps)
    metaspace, tokenizer.decoder = _metaspace("always" if s["add_prefix_space"] else "first")
    punctuation = [pre_tokenizers.Punctuation(behavior="isolated")] if s["split_by_punct"] else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*punctuation, metaspace])
    tokenizer.post_processor = cls_sep_template(s["cls_token"], s["sep_token"], ids)
    _piece_tokens(tokenizer, model)
    add_specials(tokenizer, s, DEBERTA_SPECIALS, ids)
    return tokenizer


def xlm_roberta_tokenizer(folder: Path):
    """The tokenizers.Tokenizer transformers builds from an XLM-R folder's sentencepiece.bpe.model:
    fairseq's four specials first, the model's pieces shifted past them, <mask> last."""
    return _fairseq_tokenizer(folder, lambda s, pieces: [
        (s["bos_token"], 0.0), (s["pad_token"], 0.0), (s["eos_token"], 0.0), (s["unk_token"], 0.0),
        *pieces[3:], (s["mask_token"], 0.0)], control_pieces=False)


def camembert_tokenizer(folder: Path):
    """The tokenizers.Tokenizer transformers builds from a CamemBERT folder's sentencepiece.bpe.model:
    fairseq's specials (three unused) first, the model's pieces after its first, <mask> last."""
    return _fairseq_tokenizer(folder, lambda s, pieces: [
        ("<s>NOTUSED", 0.0), (s["pad_token"], 0.0), ("</s>NOTUSED", 0.0), (s["unk_token"], 0.0),
        ("<unk>NOTUSED", -100.0), *pieces[1:], (s["mask_token"], 0.0)], control_pieces=True)


def _fairseq_tokenizer(folder: Path, arrange, control_pieces: bool):
    """<s> $A </s> over fairseq's reordered vocabulary, ``arrange(settings, pieces)``, with the
    precompiled character map front end (XLM-R, CamemBERT)."""
    from tokenizers import processors

    path = folder / "sentencepiece.bpe.model"
    model = _unigram_model(path)
    if model is None:
        return None
    s = read_settings(folder, XLMR_SPECIALS, (("add_prefix_space", True),))
    vocab = arrange(s, [(piece, score) for piece, score, _ in model.pieces])
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    require_specials(folder, s, ids, ("unk_token", "bos_token", "eos_token"))
    tokenizer = _unigram(vocab, ids[s["unk_token"]], path)
    _charsmap_and_words(tokenizer, model, "always" if s["add_prefix_space"] else "never")
    bos, eos = s["bos_token"], s["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, ids[bos]), (eos, ids[eos])])
    if control_pieces:
        _piece_tokens(tokenizer, model)
    add_specials(tokenizer, s, XLMR_SPECIALS, ids)
    return tokenizer


def albert_tokenizer(folder: Path):
    """The tokenizers.Tokenizer transformers builds from an ALBERT folder's spiece.model."""
    from tokenizers import normalizers

    path = folder / "spiece.model"
    read = _pieces_and_settings(path, ALBERT_SPECIALS,
                                (("do_lower_case", True), ("keep_accents", False), ("add_prefix_space", True)))
    if read is None:
        return None
    model, s, vocab, ids = read
    tokenizer = _unigram(vocab, ids[s["unk_token"]], path)
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    steps += [] if s["keep_accents"] else [normalizers.NFKD(), normalizers.StripAccents()]
    steps += [normalizers.Lowercase()] if s["do_lower_case"] else []
    _charsmap_and_words(tokenizer, model, "always" if s["add_prefix_space"] else "never", first=steps)
    tokenizer.post_processor = cls_sep_template(s["cls_token"], s["sep_token"], ids)
    _piece_tokens(tokenizer, model)
    add_specials(tokenizer, s, ALBERT_SPECIALS, ids)
    return tokenizer


def t5_tokenizer(folder: Path):
    """The tokenizers.Tokenizer transformers builds from a T5 / mT5 folder's spiece.model: the
    pieces, then extra_ids sentinels <extra_id_N> counting down to 0."""
    from tokenizers import AddedToken, processors

    path = folder / "spiece.model"
    model = _unigram_model(path)
    if model is None:
        return None
    s = read_settings(folder, T5_SPECIALS, ())
    extra_ids = _extra_ids(folder, s["config"])
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids - 1, -1, -1)]
    vocab = [(piece, score) for piece, score, _ in model.pieces] + [(t, 0.0) for t in sentinels]
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    tokenizer = _unigram(vocab, 2, path)
    _charsmap_and_words(tokenizer, model, "always")
    eos = s["eos_token"]
    if eos not in ids:
        raise CheckpointError(f"the sentencepiece model {path} lacks the end token {eos!r}")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:0 {eos}:0", special_tokens=[(eos, ids[eos])])
    _piece_tokens(tokenizer, model)
    add_specials(tokenizer, s, T5_SPECIALS, ids)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reversed(sentinels)])
    return tokenizer


def _extra_ids(folder: Path, config: dict) -> int:
    """T5's sentinel count from its tokenizer_config.json (100 when unset)."""
    value = config.get("extra_ids", 100)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_EXTRA_IDS:
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: extra_ids={value!r} must be a whole number "
                              f"in 0..{MAX_EXTRA_IDS}")
    return value
