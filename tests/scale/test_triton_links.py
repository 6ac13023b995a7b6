"""write_triton_repo never writes through a link, replaces an entry whole, and copies
only side files the Runtime itself would read."""
from __future__ import annotations

import os
import shutil

import pytest

from ortformer.core.errors import OutputError
from ortformer.scale import write_triton_repo



@pytest.fixture
def tiny(tmp_path, text_model):
    """A copy of the text model (tokenizer beside it) in its own folder."""
    folder = tmp_path / "src"
    folder.mkdir()
    shutil.copy(text_model, folder / "tiny.onnx")
    shutil.copy(text_model.parent / "tokenizer.json", folder / "tokenizer.json")
    return folder / "tiny.onnx"


@pytest.mark.parametrize("link", ["evil", "evil/1"])
def test_a_linked_entry_or_version_folder_is_refused(tiny, tmp_path, link):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("mine")
    repo = tmp_path / "repo"
    (repo / "evil").mkdir(parents=True)
    if link == "evil":
        (repo / "evil").rmdir()
    os.symlink(victim, repo / link)
    with pytest.raises(OutputError, match="symbolic link"):
        write_triton_repo(tiny, repo, name="evil", force=True)
    assert sorted(p.name for p in victim.iterdir()) == ["mine.txt"]


def test_force_replaces_the_entry_whole(tiny, tokens_model, tmp_path):
    repo = tmp_path / "repo"
    entry = write_triton_repo(tiny, repo, name="m")
    (entry / "2").mkdir()  # a version Triton would serve instead of ours
    (entry / "2" / "model.onnx").write_bytes(b"old")
    write_triton_repo(tokens_model, repo, name="m", force=True)
    assert sorted(str(p.relative_to(entry)) for p in entry.rglob("*")) == ["1", "1/model.onnx", "config.pbtxt"]


def test_a_hard_linked_tokenizer_is_copied_as_the_runtime_reads_it(tiny, tmp_path):
    # a tokenizer's bytes never reach the outputs as numbers: Runtime reads a hard-linked one
    # (a `cp -al` copy, a linking installer), so the entry gets a copy of its own
    os.link(tiny.parent / "tokenizer.json", tmp_path / "elsewhere.json")
    entry = write_triton_repo(tiny, tmp_path / "repo", name="m")
    for copy in (entry / "tokenizer.json", entry / "1" / "tokenizer.json"):
        assert copy.read_bytes() == (tmp_path / "elsewhere.json").read_bytes() and copy.stat().st_nlink == 1


def test_a_missing_tokenizer_is_warned_about_and_the_entry_serves_ids(tiny, tmp_path):
    """The .onnx copied without its tokenizer still serves token ids (as Runtime opens it)."""
    (tiny.parent / "tokenizer.json").unlink()
    with pytest.warns(UserWarning, match="tokenizer 'tokenizer.json' is missing; the entry serves token ids"):
        entry = write_triton_repo(tiny, tmp_path / "repo", name="m")
    assert sorted(p.name for p in entry.rglob("*")) == ["1", "config.pbtxt", "model.onnx"]
