"""Models named by their Hugging Face hub id ("org/name"): fetched into the user's hub cache with
``huggingface_hub.snapshot_download``, only the files an import reads, then imported as a local folder.

``resolve_folder`` is the one place a path-or-id becomes a folder (``load_any`` calls it, so
``export --from``, ``check --against`` and the Python API take ids alike). huggingface_hub is the
'export' extra's; the runtime never imports this module.

The files an import reads depend on files it has not fetched yet (modules.json names the module
folders, a tokenizer.json makes the vocabulary files unneeded, a missing model.safetensors makes
pytorch_model.bin needed, an index names its shards), so they are fetched in rounds until a round
wants nothing new, all rounds at the first round's commit. Offline, the same rounds read the cache.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..core.errors import CheckpointError, HubError, install_line, require
from .hf.folder_layout import (LEGACY_TOKENIZER_FILES, TOKENIZER_NAME, module_dir, module_kind, st_modules,
                                transformer_dir)
from .hf.late_folders import BGE_M3_FILES, COLBERT_AI_METADATA
from .weights import INDEX_SUFFIX, shard_names

# read by the folder importers in the root and the Transformer module's folder: the configs
# (folder_layout, sentence_config), the tokenizer and its settings (tokenizer_settings,
# vocab_tokenizers); the other modules' folders hold a config.json (and a Dense one its weights)
CONFIG_FILES = ("config.json", "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
                TOKENIZER_NAME, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                # late interaction: colbert-ai's settings, bge-m3's two heads (hf/late_folders.py; read
                # with torch.load(weights_only=True), and only their own layout has them)
                COLBERT_AI_METADATA, *BGE_M3_FILES)
# the weights, in find_weights' order of preference: safetensors (whole, then sharded) before any pickle
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors" + INDEX_SUFFIX)
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin" + INDEX_SUFFIX)
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubSnapshot:
    """A repository fetched at one commit: where its files are in the cache."""

    repo_id: str
    commit: str  # the 40-hex commit the revision resolved to
    folder: Path  # CACHE/models--org--name/snapshots/COMMIT

    @property
    def source(self) -> str:
        """What ``ortformer.source`` records ahead of the weight digests: ``hf:org/name@commit``."""
        return f"hf:{self.repo_id}@{self.commit}"


def _hub():
    """huggingface_hub's constants, errors, snapshot_download and cache folder naming."""
    require("loading a model by its Hugging Face hub id", "export", "huggingface_hub", "huggingface_hub.file_download")
    from huggingface_hub import constants, errors, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    return SimpleNamespace(constants=constants, errors=errors, snapshot_download=snapshot_download,
                           repo_folder_name=repo_folder_name)


def resolve_folder(path, *, revision: str | None = None, cache_dir=None) -> tuple[Path, HubSnapshot | None]:
    """(folder or file to import, the snapshot when ``path`` was a hub id). An existing path is itself;
    any other that huggingface_hub's rules accept as a repo id ("name" or "org/name") is fetched."""
    text = str(path)
    if Path(text).exists():
        if revision is not None or cache_dir is not None:
            raise CheckpointError(f"{text} is a local path; a revision or cache folder applies to a Hugging Face "
                                  "hub id (org/name) only")
        return Path(text), None
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        raise CheckpointError(f"{text} does not exist; pass a checkpoint folder, a weight file or a Hugging Face "
                              f"folder (a hub id needs huggingface_hub: {install_line('export')})") from None
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise CheckpointError(f"{text} does not exist; pass a checkpoint folder, a weight file, a Hugging Face "
                              "folder or a hub id (org/name)") from None
    snapshot = fetch(text, revision=revision, cache_dir=cache_dir)
    return snapshot.folder, snapshot


def _offline(hub) -> bool:
    """HF_HUB_OFFLINE as set now, or as huggingface_hub read it when imported (it refuses requests then)."""
    now = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return now or bool(getattr(hub.constants, "HF_HUB_OFFLINE", False))


def _cache_root(hub, cache_dir) -> Path:
    """--cache-dir, else HF_HUB_CACHE, else HF_HOME/hub, as set now, else huggingface_hub's default."""
    chosen = (cache_dir or os.environ.get("HF_HUB_CACHE")
              or (os.environ.get("HF_HOME") and os.path.join(os.environ["HF_HOME"], "hub"))
              or hub.constants.HF_HUB_CACHE)
    return Path(chosen).expanduser().resolve()


def check_revision(revision: str | None) -> None:
    """A revision names a git ref or commit; the cache stores refs as files, so one that climbs out
    of its folder is refused (git refuses ".." in ref names too)."""
    if revision is None:
        return
    if (not revision or ".." in revision or revision.startswith("/") or "\\" in revision
            or any(ord(c) < 32 or c == "\x7f" for c in revision)):
        raise HubError(f"revision {revision!r} is not a branch, tag or commit name; give one that exists in the "
                       "repository (e.g. main, v1.0 or a 40-hex commit)")


def _folders(root: Path | None) -> dict[str, tuple[tuple[str, ...], bool]]:
    """The folders an import reads, relative to the snapshot ("" the root), each with the config
    files read there and whether it may hold weights: the root and a Transformer module all of
    CONFIG_FILES and weights; a Dense module its config.json and weights; Pooling, Normalize and
    the other modules their config.json."""
    folders = {"": (CONFIG_FILES, True)}
    if root is not None and (root / "modules.json").is_file():
        for module in st_modules(root):
            rel = module_dir(root, module).relative_to(root).as_posix()
            kind = module_kind(module)
            files = CONFIG_FILES if kind in ("Transformer", "MLMTransformer") else ("config.json",)
            folders.setdefault("" if rel == "." else rel, (files, kind in ("Transformer", "MLMTransformer", "Dense")))
    return folders


def wanted_files(folder: Path | None, requested: set[str]) -> set[str]:
    """The repository files the import of ``folder`` reads, as far as the files already there tell
    (``requested``: names already asked for, so a missing one is known to be absent)."""
    root = folder if folder is not None and folder.is_dir() else None
    wanted: set[str] = set()
    for d, (files, weighted) in _folders(root).items():
        at = (lambda name, d=d: f"{d}/{name}" if d else name)
        wanted.update(at(n) for n in (*files, *(SAFE_WEIGHTS if weighted else ())))
        if not weighted:
            continue
        here = (root / d) if root is not None else None
        present = [n for n in (*SAFE_WEIGHTS, *PICKLE_WEIGHTS) if here is not None and (here / n).is_file()]
        if not present and all(at(n) in requested for n in SAFE_WEIGHTS):
            wanted.update(at(n) for n in PICKLE_WEIGHTS)  # no safetensors: the pickles are what there is
        if present and present[0].endswith(INDEX_SUFFIX):
            wanted.update(at(shard) for shard in shard_names(here / present[0]))
    if root is not None:
        model_dir = transformer_dir(root).relative_to(root).as_posix()
        tokenizer_dirs = list(dict.fromkeys(("" if model_dir == "." else model_dir, "")))
        asked = all((f"{d}/{TOKENIZER_NAME}" if d else TOKENIZER_NAME) in requested for d in tokenizer_dirs)
        if asked and not any((root / d / TOKENIZER_NAME).is_file() for d in tokenizer_dirs):
            # an older save: its vocabulary is what a tokenizer.json gets built from
            wanted.update(f"{d}/{n}" if d else n for d in tokenizer_dirs for n in LEGACY_TOKENIZER_FILES)
    return wanted


def _pattern(name: str) -> str:
    """``name`` as an allow_patterns entry that matches it alone (fnmatch's [*?[] escaped)."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def fetch(repo_id: str, *, revision: str | None = None, cache_dir=None) -> HubSnapshot:
    """The files of ``repo_id`` an import reads, at ``revision`` (default: the main branch), in the
    hub cache; offline (HF_HUB_OFFLINE) from the cache alone. Raises HubError saying what to do."""
    hub = _hub()
    check_revision(revision)
    cache = _cache_root(hub, cache_dir)
    offline = _offline(hub)
    endpoint = (os.environ.get("HF_ENDPOINT") or hub.constants.ENDPOINT).rstrip("/")
    storage = cache / hub.repo_folder_name(repo_id=repo_id, repo_type="model")
    folder, at, requested = None, revision, set()
    while True:
        new = sorted(wanted_files(folder, requested) - requested)
        if not new:
            break
        folder = _download(hub, repo_id, at, new, cache=cache, endpoint=endpoint, offline=offline, asked=revision)
        # checked before the next round reads what this one fetched (modules.json, an index)
        if not _COMMIT.fullmatch(folder.name):
            raise HubError(f"{repo_id}: the hub cache gave {folder}, not a snapshot folder named by its commit")
        _check_inside(folder, storage)
        at = folder.name  # every later round at this commit, wherever the branch moves meanwhile
        requested.update(new)
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise HubError(f"{repo_id} (commit {folder.name}) holds no config.json: ortformer imports Hugging Face and "
                       "sentence-transformers model repositories")
    return HubSnapshot(repo_id, folder.name, folder)


def _check_inside(folder: Path, storage: Path) -> None:
    """Every file and folder of the snapshot resolves inside the repository's cache folder: a link
    out of it (a tampered cache) is refused before anything is read."""
    storage = storage.resolve()
    entries = [folder]
    for top, dirs, files in os.walk(folder):
        entries += [Path(top) / name for name in (*dirs, *files)]
    for entry in entries:
        if not entry.resolve().is_relative_to(storage):
            raise HubError(f"{entry} resolves to {entry.resolve()}, outside the hub cache folder {storage}; "
                           "the cache was altered: delete that folder and fetch the model again")


def _no_match_notice(record: logging.LogRecord) -> bool:
    """False for snapshot_download's notice that no file matched: a round asks for files a
    repository may not have (a pytorch_model.bin where there is none) by design."""
    return not record.getMessage().startswith("No files matched")


def _download(hub, repo_id: str, revision, names: list[str], *, cache: Path, endpoint: str, offline: bool,
              asked: str | None) -> Path:
    """snapshot_download of ``names`` at ``revision`` (after the first round, the commit the revision
    ``asked`` resolved to); huggingface_hub's errors become HubErrors that say what to do."""
    errors = hub.errors
    where = f"{repo_id}" + (f" (revision {asked})" if asked else "")
    notices = logging.getLogger(hub.snapshot_download.__module__)
    notices.addFilter(_no_match_notice)
    try:
        return Path(hub.snapshot_download(repo_id, revision=revision, cache_dir=cache, endpoint=endpoint,
                                          local_files_only=offline, allow_patterns=[_pattern(n) for n in names]))
    except errors.GatedRepoError:
        raise HubError(f"{repo_id} is a gated model: accept its conditions at {endpoint}/{repo_id}, then log in "
                       "with an account that has access (`hf auth login`, or set HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{repo_id} is neither a local path nor a model on the hub ({endpoint}): check the name, "
                       "or log in (`hf auth login`, or set HF_TOKEN) if it is private") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {asked or 'main'!r}: give a branch, tag or commit of the "
                       "repository") from None
    except errors.LocalEntryNotFoundError as exc:
        incomplete = type(exc).__name__ == "IncompleteSnapshotError"
        cached = f"{'only part of ' if incomplete else 'no copy of '}{where} is in the hub cache {cache}"
        if offline:
            raise HubError(f"HF_HUB_OFFLINE is set and {cached}: fetch it once online (HF_HUB_OFFLINE unset), "
                           "or give the cache folder that holds it (HF_HOME, HF_HUB_CACHE or --cache-dir)") from None
        cause = exc.__cause__ or exc.__context__
        why = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}" if cause else "no answer"
        raise HubError(f"cannot reach the hub at {endpoint} ({why}) and {cached}: check the network or "
                       "HF_ENDPOINT, or fetch it where the hub is reachable into this cache") from None
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "an error")
        raise HubError(f"the hub at {endpoint} answered {status} for {where}: "
                       f"{str(exc).strip().splitlines()[0]}; try again later") from None
    except OSError as exc:  # the cache folder cannot be written, a download cut short
        raise HubError(f"cannot fetch {where} into the hub cache {cache}: {exc}") from None
    finally:
        notices.removeFilter(_no_match_notice)
