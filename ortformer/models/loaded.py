"""What every loader returns: the model and where it came from, and the two groups of
``exporter.export``'s arguments an import fills in (TextSettings, Provenance)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..config import EncoderConfig
from .encoder import Encoder


@dataclass(frozen=True)
class TextSettings:
    """How the file reads texts (all optional; nothing without a tokenizer but the length).

    tokenizer: a tokenizer.json copied beside the model as ``<stem>.tokenizer.json`` and named in
    the metadata, so ``Runtime.embed_texts`` and ``infer --text`` work. max_length: default
    truncation (sentence-transformers' max_seq_length). lowercase: texts are lowercased before
    tokenizing (do_lower_case). prompts / default_prompt: sentence-transformers prompts (name ->
    text prepended before tokenizing) and the one ``embed_texts`` uses when none is named.
    late: a late.LateInteraction (markers, query expansion, skiplist) for a model with a per-token
    head (token_embeddings, sparse), recorded for ``Runtime.embed_texts(kind=...)``. rerank: an
    LLM reranker's rerank_template.RerankTemplate (a one-label head on the last token), recorded
    for ``Runtime.rerank`` and serve's /rerank."""
    tokenizer: Path | str | None = None
    max_length: int | None = None
    lowercase: bool = False
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    late: Any = None
    rerank: Any = None


@dataclass(frozen=True)
class Provenance:
    """Where the weights came from. source: recorded as ``ortformer.source`` (default: the
    weights' digest, or the random-init seed); family: the Hugging Face model_type, for ``info``;
    labels: the classifier head's label names by id (config.classifier.labels of them)."""
    source: str | None = None
    family: str | None = None
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Loaded:
    """A loaded encoder and its provenance, the same for ortformer checkpoints and imports."""

    model: Encoder
    # "sha256:<hex>" of the weight file; several files: one each, comma-separated; a hub id's
    # import starts with "hf:org/name@<commit>,"
    source: str
    tokenizer: Path | None  # tokenizer.json travelling with the weights, if any
    text_max_length: int | None = None  # sentence-transformers' max_seq_length, when set
    text_lowercase: bool = False  # sentence-transformers' do_lower_case: lowercase before tokenizing
    weights: Path | None = None  # the weight file read
    dropped: tuple[str, ...] = ()  # imported tensors deliberately not used (poolers, task heads)
    family: str = "ortformer"  # where the model came from: "ortformer" or a Hugging Face model_type
    # sentence-transformers prompts: name -> text prepended to each input before tokenizing
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None  # the prompt used when the caller names none
    labels: tuple[str, ...] = ()  # the classifier head's label names by id (config.classifier.labels)
    fetched: Path | None = None  # a hub id's snapshot folder in the cache; None for a local path
    # late interaction (ColBERT, bge-m3): markers, query expansion and skiplist as the folder names them,
    # made token ids with the tokenizer (hf/late_folders.py's LateSpec), or None
    late_spec: object | None = None
    # an LLM reranker's prompt template (rerank_template.RerankTemplate), or None
    rerank: object | None = None
    # a Hugging Face folder's files as the import parsed them (hf/folder_files.FolderFiles); None otherwise
    folder: object | None = None

    def late(self):
        """The late-interaction settings (late.LateInteraction) as token ids of this model's tokenizer, or None."""
        if self.late_spec is None:
            return None
        from .hf.late_folders import resolve

        return resolve(self.late_spec, self.tokenizer, self.config.vocab_size)

    @property
    def config(self) -> EncoderConfig:
        return self.model.config

    def export_options(self, text: bool = True) -> dict:
        """``exporter.export``'s provenance group (source, family, labels) and, with ``text``, its
        text group (tokenizer, truncation length, lowercasing, prompts, late interaction), as
        keywords: ``export(loaded.model, path, **loaded.export_options())``."""
        options = {"provenance": Provenance(self.source, None if self.family == "ortformer" else self.family,
                                            tuple(self.labels))}
        if text:
            options["text"] = self.text_settings()
        return options

    def text_settings(self, **changes):
        """How the exported file reads texts (exporter.settings.TextSettings), from this import;
        ``changes`` set fields over it (tokenizer=, lowercase=: what a caller chose instead)."""
        import dataclasses

        settings = TextSettings(self.tokenizer, self.text_max_length, self.text_lowercase, dict(self.prompts),
                                self.default_prompt, self.late(), self.rerank)
        return dataclasses.replace(settings, **changes)
