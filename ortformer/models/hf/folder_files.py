"""``FolderFiles``: an imported folder's files, each parsed once, handed from ``load_any`` through
``Family.load`` and ``import_folder`` to the export (through the ``Loaded`` it gives).

config.json (the Transformer module's: the root's, or the folder modules.json names when the root
has no Hugging Face config) is parsed when the object is made; modules.json, the
sentence-transformers configs and the tokenizer's place are read on first use and kept.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from ...core.errors import CheckpointError
from .folder_layout import find_tokenizer, module_dir, module_kind, read_json, st_modules

CONFIG_NAME = "config.json"
TRANSFORMER_KINDS = ("Transformer", "MLMTransformer")


class FolderFiles(os.PathLike):
    """A Hugging Face / sentence-transformers folder, read once.

    root: the folder given; model_dir: the folder holding the model's config.json and weights;
    config: that config.json (a folder without one is refused); modules: modules.json's entries ([] without);
    sentence: what the sentence-transformers configs say (sentence_config.SentenceConfig);
    tokenizer: tokenizer.json in model_dir, else root, else None.
    It is a path-like of ``root``, so code written for a folder path takes it too.
    """

    def __init__(self, root: Path, model_dir: Path, config: dict, modules: list[dict] | None = None):
        self.root, self.model_dir, self.config = root, model_dir, config
        if modules is not None:
            self.__dict__["modules"] = modules  # already read: the cached property's slot

    @classmethod
    def read(cls, folder) -> "FolderFiles":
        """Locate the Transformer module and parse its config.json (CheckpointError for a
        path that is not a folder, or a JSON file that cannot be read)."""
        root = Path(folder)
        if not root.is_dir():
            raise CheckpointError(f"{root} is not a folder; pass a Hugging Face model folder")
        path = root / CONFIG_NAME
        config = read_json(path) if path.is_file() else None
        model_dir, modules = root, None
        # sentence-transformers < 2 keeps only {"__version__": ...} in the root config.json,
        # beside the Transformer module's folder (0_Transformer/)
        if config is None or ((root / "modules.json").is_file() and "model_type" not in config):
            modules = st_modules(root)
            inner = next((module_dir(root, m) for m in modules if module_kind(m) in TRANSFORMER_KINDS), None)
            if inner is not None:
                model_dir, config = inner, None
        if config is None:  # not yet read (or absent: read_json says so)
            config = read_json(model_dir / CONFIG_NAME)
        return cls(root, model_dir, config, modules)

    @classmethod
    def of(cls, folder) -> "FolderFiles":
        """``folder`` as it is when already read, else read now."""
        return folder if isinstance(folder, FolderFiles) else cls.read(folder)

    @classmethod
    def hugging_face(cls, folder) -> "FolderFiles | None":
        """The folder read, when its config.json is a Hugging Face config (has model_type); else None."""
        try:
            files = cls.read(folder)
        except CheckpointError:
            return None
        return files if "model_type" in files.config else None

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __repr__(self) -> str:
        return f"FolderFiles({str(self.root)!r})"

    @property
    def model_type(self):
        return self.config.get("model_type")

    @functools.cached_property
    def modules(self) -> list[dict]:
        return st_modules(self.root)

    @functools.cached_property
    def sentence(self):
        from .sentence_config import read_sentence_config

        return read_sentence_config(self.root, self.model_dir, self.modules)

    @functools.cached_property
    def tokenizer(self) -> Path | None:
        return find_tokenizer(self.model_dir, self.root)
