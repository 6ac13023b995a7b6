"""Config files written by an earlier release (format 1: one flat object) still load. Each
tests/data/config_format1/NAME.json is the 'ortformer.config' metadata of a tiny model exported
by that release, beside NAME.params.json: the parameter names and shapes its encoder had."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ortformer import contract
from ortformer.config import EncoderConfig
from ortformer.models.encoder import build_encoder
from support.text_models import set_metadata

DATA = Path(__file__).parent / "data" / "config_format1"
NAMES = sorted(p.name[:-len(".json")] for p in DATA.glob("*.json") if not p.name.endswith(".params.json"))


def test_the_files_are_format_1_and_cover_the_variants():
    assert {"classifier", "token_classifier", "conv", "relative", "disentangled", "local", "sentence_dense",
            "late_interaction"} <= set(NAMES)
    for name in NAMES:
        assert json.loads((DATA / f"{name}.json").read_text())["format"] == 1, name


@pytest.mark.parametrize("name", NAMES)
def test_a_format_1_config_builds_the_model_that_release_built(name):
    cfg = EncoderConfig.from_json((DATA / f"{name}.json").read_text())
    want = json.loads((DATA / f"{name}.params.json").read_text())
    got = {key: list(tensor.shape) for key, tensor in build_encoder(cfg).state_dict().items()}
    assert got == want
    # and it survives the current format unchanged
    assert EncoderConfig.from_json(cfg.to_json()) == cfg


def test_a_runtime_opens_a_file_whose_metadata_is_format_1(tmp_path):
    from ortformer.exporter import export
    from ortformer.runtime import Runtime

    text = (DATA / "classifier.json").read_text().strip()
    cfg = EncoderConfig.from_json(text)
    path = tmp_path / "model.onnx"
    export(cfg, path, seed=0, parity=False)
    old = set_metadata(path, contract.META_CONFIG, text, tmp_path / "old.onnx")
    ids = np.array([[1, 5, 7, 2]], dtype=np.int64)
    mask = np.ones_like(ids)
    rt_old, rt_new = Runtime(old), Runtime(path)
    assert rt_old.config == cfg
    got, want = rt_old.run(ids, mask), rt_new.run(ids, mask)
    assert set(got) == set(want) and "logits" in got
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
