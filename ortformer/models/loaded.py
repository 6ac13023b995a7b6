"""What every loader returns: the model and where it came from."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import EncoderConfig
from .encoder import Encoder


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
        """The keyword arguments of ``exporter.export`` that carry this model's provenance and,
        with ``text``, how it reads texts (tokenizer, truncation length, lowercasing, prompts)."""
        options = {"source": self.source, "family": None if self.family == "ortformer" else self.family,
                   "labels": self.labels}
        if text:
            options.update(tokenizer=self.tokenizer, text_max_length=self.text_max_length,
                           text_lowercase=self.text_lowercase, prompts=self.prompts,
                           default_prompt=self.default_prompt, late=self.late())
        return options
