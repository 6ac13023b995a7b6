"""Files are never lost: SIGKILL at random moments during save_checkpoint and export.

A zygote process (kill_child.py) forks one writer per trial and kills it at a
random delay, or at a chosen point between the two renames of a checkpoint save.
Afterwards every trial folder must hold the old files or the complete new ones:
- checkpoint: loads, and is exactly the old model (config + weights) or exactly
  the new one, never new weights with the old config; no visible partial files;
- export: model bytes identical to the old file, or a complete new model that
  reads, names the new source and runs with finite outputs.
An existing output is never replaced without force (checked at the end).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
from support import kill_child
from support.reliability import SUPPORT, child_env, scaled

from ortformer.core.errors import CheckpointError, ExportError
from ortformer.models import build_encoder
from ortformer.models.checkpoint import load_checkpoint, save_checkpoint
from ortformer.runtime import Runtime, read_model_file



def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trials(tmp_path_factory, tokens_model) -> list[dict]:
    workdir = tmp_path_factory.mktemp("kills")
    plan = {"workdir": str(workdir), "seed": 20261129, "checkpoint_trials": scaled(26),
            "export_trials": scaled(6), "old_model": str(tokens_model)}
    (workdir / "plan.json").write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, str(SUPPORT / "kill_child.py"), str(workdir / "plan.json")],
                         check=False, capture_output=True, text=True, env=child_env(), timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert records and records[-1] == {"writer": "done"}, out.stdout[-2000:] + out.stderr[-2000:]
    return records[:-1]


def test_checkpoint_save_killed_anywhere_leaves_old_or_new(trials, figures):
    old_state = build_encoder(kill_child.CKPT_OLD, seed=0).state_dict()
    new_state = build_encoder(kill_child.CKPT_NEW, seed=1).state_dict()
    outcomes = {"old": 0, "new": 0}
    leftovers = 0
    ckpt = [r for r in trials if r["writer"] == "checkpoint"]
    assert len(ckpt) >= 20
    for r in ckpt:
        folder = Path(r["folder"])
        assert r["sigkilled"], r  # every trial really died by SIGKILL, mid-write
        visible = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        leftovers += sum(1 for p in folder.iterdir() if p.name.startswith("."))
        assert set(visible) <= {"config.json", "model.safetensors"} and "model.safetensors" in visible, (r, visible)
        try:
            model = load_checkpoint(folder)
        except CheckpointError as exc:
            pytest.fail(f"trial {r['trial']} ({r['mode']}): the checkpoint no longer loads: {exc}")
        state = model.state_dict()
        if model.config == kill_child.CKPT_OLD and states_equal(state, old_state):
            outcomes["old"] += 1
        elif model.config == kill_child.CKPT_NEW and states_equal(state, new_state):
            outcomes["new"] += 1
        else:
            pytest.fail(f"trial {r['trial']}: neither the old nor the new checkpoint: config {model.config}")
    figures.set("kill_trials", "checkpoint_trials", len(ckpt))
    figures.set("kill_trials", "checkpoint_outcomes", outcomes)
    figures.set("kill_trials", "checkpoint_hidden_temp_files_left", leftovers)
    assert outcomes["old"] and outcomes["new"], f"kills never landed on both sides of the commit: {outcomes}"


def test_export_killed_anywhere_leaves_old_or_new(trials, tokens_model, figures):
    old_bytes = tokens_model.read_bytes()
    calibration = [r for r in trials if r["writer"] == "export-calibration"]
    assert calibration and all(r["exit_code"] == 0 and not r["sent_kill"] for r in calibration), calibration
    for r in calibration:  # an unkilled forked export commits a complete new model
        assert read_model_file(Path(r["folder"]) / "m.onnx").source == "kill-trial-new"
    exports = [r for r in trials if r["writer"] == "export"]
    killed = [r for r in exports if r["sigkilled"]]
    assert len(killed) >= len(exports) // 2, "most kills should land before the export finished"
    outcomes = {"old": 0, "new": 0}
    leftovers = 0
    for r in exports:
        folder = Path(r["folder"])
        path = folder / "m.onnx"
        visible = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        leftovers += sum(1 for p in folder.iterdir() if p.name.startswith("."))
        assert visible == ["m.onnx"], (r, visible)
        if path.read_bytes() == old_bytes:
            outcomes["old"] += 1
            continue
        model = read_model_file(path)  # complete: parses, metadata and graph check out
        assert model.source == "kill-trial-new", r
        out = Runtime(path, "cpu").run(input_ids=[[1, 2, 3]])
        assert all(torch.isfinite(torch.from_numpy(v)).all() for v in out.values())
        outcomes["new"] += 1
    figures.set("kill_trials", "export_trials", len(exports))
    figures.set("kill_trials", "export_hidden_staging_dirs_left", leftovers)
    figures.set("kill_trials", "export_trials_killed_mid_write", len(killed))
    figures.set("kill_trials", "export_outcomes", outcomes)
    figures.set("kill_trials", "export_kill_points", sorted({(r["lines"] or ["(none)"])[-1].split(" of /")[0] for r in exports}))
    assert len(exports) >= 4


def test_existing_outputs_are_never_replaced_without_force(tmp_path, tokens_model, monkeypatch):
    export_module = sys.modules["ortformer.exporter.export"]  # the package re-exports `export` over it
    cfg = read_model_file(tokens_model).config
    folder = tmp_path / "ckpt"
    save_checkpoint(build_encoder(cfg, seed=0), folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(CheckpointError, match="force=True"):
        save_checkpoint(build_encoder(cfg, seed=1), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before

    cached = onnx.load(str(tokens_model))  # skip the trace: the refusal is about the destination
    monkeypatch.setattr(export_module, "_trace_to_onnx", lambda *a, **k: onnx.ModelProto.FromString(cached.SerializeToString()))
    target = tmp_path / "m.onnx"
    target.write_bytes(b"precious")
    with pytest.raises(ExportError, match="already exists"):
        export_module.export(cfg, target, parity=False)
    assert target.read_bytes() == b"precious" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "m.onnx"]
