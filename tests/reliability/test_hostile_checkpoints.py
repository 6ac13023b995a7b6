"""Hostile checkpoints for load_checkpoint / load_any, beyond tests/models/test_checkpoint.py.

Guarantees: a checkpoint either loads as finite float32 weights of the shapes its
config implies, or raises CheckpointError; nothing in it is executed.
- byte mutations (hypothesis) of a valid safetensors file, header bytes favoured;
- generated safetensors headers (shapes, dtypes, offsets, metadata of any kind);
- truncation at every byte of the header and at many points in the data;
- pickles that would run code in the formats torch.load knows (zip, legacy, raw
  protocol 0/2/5), also reached through load_any's BERT-folder path;
- config.json that is not UTF-8, nested thousands deep, or a folder.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.reliability import scaled

from ortformer.config import preset
from ortformer.core.errors import CheckpointError
from ortformer.models import build_encoder
from ortformer.models import load_any, load_checkpoint, save_checkpoint

CFG = preset("tiny", max_positions=16, vocab_size=40)


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[bytes, bytes, int]:
    """(model.safetensors bytes, config.json bytes, header end offset) of a saved checkpoint."""
    folder = tmp_path_factory.mktemp("valid-ckpt")
    save_checkpoint(build_encoder(CFG, seed=0), folder)
    data = (folder / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return data, (folder / "config.json").read_bytes(), 8 + length


@pytest.fixture(scope="module")
def shapes() -> dict:
    return {k: tuple(v.shape) for k, v in build_encoder(CFG, seed=0).state_dict().items()}


def load_outcome(path: Path, figures, section: str, **kwargs) -> str:
    """'refused' or 'loaded'; any exception but CheckpointError fails the test."""
    figures.add(section, "files_tried")
    try:
        model = load_checkpoint(path, **kwargs)
    except CheckpointError:
        figures.add(section, "checkpoint_errors")
        return "refused"
    except Exception as exc:  # noqa: BLE001 - the failure this test looks for
        figures.add(section, "other_exceptions")
        pytest.fail(f"{type(exc).__name__} (not CheckpointError): {exc}")
    figures.add(section, "loaded")
    expected = {k: tuple(v.shape) for k, v in build_encoder(model.config, seed=0).state_dict().items()}
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and tuple(tensor.shape) == expected[name], name
        assert torch.isfinite(tensor).all(), f"{name} holds NaN/inf after a successful load"
    assert set(model.state_dict()) == set(expected)
    return "loaded"


@st.composite
def mutations(draw, size: int, header_end: int):
    """A list of (position, new byte), plus an optional truncation or extension."""
    edits = []
    for _ in range(draw(st.integers(1, 8))):
        region = draw(st.sampled_from(["length", "header", "header", "header", "data"]))
        low, high = {"length": (0, 7), "header": (8, header_end - 1), "data": (header_end, size - 1)}[region]
        edits.append((draw(st.integers(low, high)), draw(st.integers(0, 255))))
    tail = draw(st.sampled_from(["keep"] * 6 + ["cut", "extend"]))
    return edits, tail, draw(st.integers(1, 4096))


@settings(max_examples=scaled(150), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_byte_mutations_of_a_safetensors_file(tmp_path_factory, valid, figures, data):
    raw, config_json, header_end = valid
    edits, tail, amount = data.draw(mutations(len(raw), header_end))
    mutated = bytearray(raw)
    for position, value in edits:
        mutated[position] = value
    if tail == "cut":
        mutated = mutated[: max(0, len(mutated) - amount)]
    elif tail == "extend":
        mutated += bytes(amount)
    folder = tmp_path_factory.mktemp("mutated", numbered=True)
    (folder / "model.safetensors").write_bytes(bytes(mutated))
    with_config = data.draw(st.booleans())
    if with_config:
        (folder / "config.json").write_bytes(config_json)
    outcome = load_outcome(folder, figures, "hostile_checkpoints")
    if outcome == "loaded" and with_config:
        assert load_checkpoint(folder).config == CFG
    shutil.rmtree(folder)


DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3", "C64", "XYZ", "", 5, None]


@st.composite
def headers(draw, shapes: dict):
    names = sorted(shapes)
    entries, offset = {}, 0
    for name in draw(st.lists(st.sampled_from(names + ["extra", "__metadata__", ""]), max_size=6)):
        shape = draw(st.one_of(st.just(list(shapes.get(name, (3,)))),
                               st.lists(st.integers(-3, 2**62), max_size=4),
                               st.lists(st.sampled_from([0, 1, 2, 32, 64]), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        begin = draw(st.sampled_from([offset, 0, offset + 4, -4, 2**63]))
        end = draw(st.sampled_from([begin + 4 * int(np.prod(shape, dtype=object) or 0) if isinstance(begin, int) else 0,
                                    begin, begin + 4, 2**64, "x"]))
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        offset = end if isinstance(end, int) else offset
    if draw(st.booleans()):
        entries["__metadata__"] = draw(st.sampled_from([
            {"ortformer.format": "1", "ortformer.config": CFG.to_json()}, {"ortformer.config": "[" * 5000},
            {"ortformer.config": 5}, [], "x", {"ortformer.config": json.dumps({"format": 7})}, None]))
    return entries


@settings(max_examples=scaled(150), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_safetensors_headers(tmp_path_factory, shapes, figures, data):
    header = data.draw(headers(shapes))
    body = json.dumps(header).encode()
    if data.draw(st.integers(0, 9)) == 0:
        body = b"[" * 100_000 + body  # nested thousands deep: json's RecursionError
    padding = data.draw(st.sampled_from([0, 4, 64, 20_000]))
    folder = tmp_path_factory.mktemp("header", numbered=True)
    path = folder / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(padding))
    config = data.draw(st.sampled_from([CFG, None]))
    load_outcome(path, figures, "hostile_checkpoints", config=config)
    shutil.rmtree(folder)


def test_truncation_at_every_header_byte_and_many_data_points(tmp_path, valid, figures):
    raw, config_json, header_end = valid
    (tmp_path / "config.json").write_bytes(config_json)
    cuts = set(range(header_end + 2)) | set(np.linspace(header_end, len(raw) - 1, scaled(60)).astype(int).tolist())
    path = tmp_path / "model.safetensors"
    for cut in sorted(cuts):
        path.write_bytes(raw[:cut])
        assert load_outcome(tmp_path, figures, "hostile_checkpoints") == "refused", cut
    path.write_bytes(raw)
    assert load_outcome(tmp_path, figures, "hostile_checkpoints") == "loaded"  # control
    figures.add("hostile_checkpoints", "truncation_cut_points", len(cuts))


# ---------------------------------------------------------------- pickles that would run code

def marker_command(marker: Path) -> str:
    return f"touch {marker}"


class SystemPayload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (marker_command(self.marker),))


class EvalPayload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


def raw_pickles(marker: Path) -> dict[str, bytes]:
    state = {k: v.clone() for k, v in build_encoder(CFG, seed=0).state_dict().items()}
    protocol0 = f"cposix\nsystem\n(V{marker_command(marker)}\ntR.".encode()
    return {
        "protocol0_os_system": protocol0,
        "protocol2_os_system": pickle.dumps({"w": SystemPayload(marker)}, protocol=2),
        "protocol5_eval": pickle.dumps(EvalPayload(marker), protocol=5),
        "state_dict_plus_payload_p2": pickle.dumps({**{k: v.numpy() for k, v in list(state.items())[:2]},
                                                    "x": SystemPayload(marker)}, protocol=2),
    }


def torch_zip_with(pickled: bytes) -> bytes:
    """A torch.save zip archive whose data.pkl is replaced by `pickled`."""
    buffer = io.BytesIO()
    torch.save({"norm.weight": torch.ones(3)}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            target.writestr(item, pickled if item.filename.endswith("data.pkl") else data)
    return out.getvalue()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_code_carrying_pickles_are_refused_and_never_run(tmp_path, figures):
    marker = tmp_path / "MARKER"
    control = tmp_path / "CONTROL"
    pickle.loads(raw_pickles(control)["protocol0_os_system"])  # the payloads really run when unpickled unsafely
    pickle.loads(raw_pickles(control)["protocol5_eval"])
    assert control.exists()
    files = {}
    for name, data in raw_pickles(marker).items():
        files[f"{name}.pt"] = data
        files[f"{name}_zip.pt"] = torch_zip_with(data)
        files[f"{name}.bin"] = torch_zip_with(data)
    buffer = io.BytesIO()
    torch.save({"norm.weight": SystemPayload(marker)}, buffer)
    files["torch_save_of_payload.pth"] = buffer.getvalue()
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        figures.add("hostile_checkpoints", "files_tried")
        figures.add("hostile_checkpoints", "code_carrying_pickles")
        with pytest.raises(CheckpointError):
            load_checkpoint(path, config=CFG)
        assert not marker.exists(), f"{name}: the payload ran"
    # the same through load_any's Hugging Face path: a BERT folder with a hostile pytorch_model.bin
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 40, "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 64, "max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu",
        "layer_norm_eps": 1e-12}))
    for name, data in raw_pickles(marker).items():
        (bert / "pytorch_model.bin").write_bytes(torch_zip_with(data))
        figures.add("hostile_checkpoints", "files_tried")
        figures.add("hostile_checkpoints", "code_carrying_pickles")
        with pytest.raises(CheckpointError):
            load_any(bert)
        assert not marker.exists(), f"bert/{name}: the payload ran"


# ---------------------------------------------------------------- config.json

@pytest.mark.parametrize("kind", ["not_utf8", "nested_deep", "a_folder", "not_an_object", "unknown_key"])
def test_hostile_config_json(tmp_path, valid, figures, kind):
    raw, _, _ = valid
    (tmp_path / "model.safetensors").write_bytes(raw)
    config = tmp_path / "config.json"
    if kind == "not_utf8":
        config.write_bytes(b"\xff\xfe{\x00")
    elif kind == "nested_deep":
        config.write_text("[" * 100_000)
    elif kind == "a_folder":
        config.mkdir()
    elif kind == "not_an_object":
        config.write_text("[1, 2]")
    else:
        config.write_text(json.dumps({**CFG.to_dict(), "wings": 2}))
    outcome = load_outcome(tmp_path, figures, "hostile_checkpoints")
    # a folder named config.json is not a config: the weight file's own config is used
    assert outcome == ("loaded" if kind == "a_folder" else "refused")


HUGE_CONFIG_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))  # a runaway build fails here, not in the OOM killer
from ortformer.core.errors import CheckpointError
from ortformer.models.checkpoint import load_checkpoint
try:
    load_checkpoint(sys.argv[1])
except CheckpointError as exc:
    print("CheckpointError", exc)
except BaseException as exc:
    print("OTHER", type(exc).__name__, exc)
else:
    print("LOADED")
"""


def test_a_config_describing_a_huge_model_is_refused_before_building_it(tmp_path, figures):
    """config.json is text: hidden_size=65536 with 64 layers would make build_encoder allocate
    over a terabyte before a single tensor is compared. Run in a child under an address-space
    limit, so that a regression fails this test instead of the machine."""
    import subprocess
    import sys

    from support.reliability import child_env

    torch.save(build_encoder(CFG, seed=0).state_dict(), tmp_path / "model.pt")  # no embedded config
    (tmp_path / "config.json").write_text(preset("tiny", hidden_size=2**16, num_heads=4, num_layers=64,
                                                  ffn_size=2**18).to_json())
    out = subprocess.run([sys.executable, "-c", HUGE_CONFIG_CHILD, str(tmp_path)], check=False, capture_output=True, text=True,
                         env=child_env(), timeout=300)
    figures.add("hostile_checkpoints", "files_tried")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("CheckpointError") and "parameters" in out.stdout, out.stdout + out.stderr[-2000:]


def test_load_any_with_a_deeply_nested_config_json(tmp_path, valid):
    raw, _, _ = valid
    (tmp_path / "model.safetensors").write_bytes(raw)
    (tmp_path / "config.json").write_text("[" * 100_000)
    with pytest.raises(CheckpointError):
        load_any(tmp_path)
