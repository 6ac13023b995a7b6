"""export padding="right": the fused attention takes key lengths (B,) instead of the (B, N) mask,
and the Runtime right-aligns rows that are not right-padded (runtime/right_padding.py).

Checked on the CPU provider: the float32 and float16 gates (the grid's left, random and fully
padded cases included, right-aligned as the Runtime feeds them), the graph's mask form, and
padding invariance through Runtime.run given left-padded and scattered rows directly."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from ortformer import contract
from ortformer.config import preset
from ortformer.core.errors import ExportError, ModelFileError
from ortformer.exporter import GraphOptions, export
from ortformer.models import build_encoder
from ortformer.runtime import Runtime
from ortformer.runtime.providers import KEY_LENGTH_SDPA_KERNELS, provider_list
from ortformer.runtime.right_padding import align_feeds, alignment, restore_outputs, right_padded

CONFIGS = {
    # learned positions counted from column 0 (BERT's), token types, mean pooling
    "learned": preset("tiny"),
    # rotary positions through RotaryEmbedding before the fused attention; positions counted over kept tokens
    "rotary": preset("tiny", positions="rotary", type_vocab_size=0, pooling="cls"),
    # RoBERTa's positions: the kept tokens' count, so right-aligning changes nothing the 2-D mask graph computes
    "kept": preset("tiny", position_ids="kept", position_offset=2, max_positions=66),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: (path, eager model, export report)} for each config, exported with padding="right" and the gate on."""
    made = {}
    for name, cfg in CONFIGS.items():
        model = build_encoder(cfg, seed=3)
        path = tmp_path_factory.mktemp(name) / "model.onnx"
        result = export(model, path, graph=GraphOptions(padding="right"))
        made[name] = (path, model, result.report)
    return made


def eager(model, ids, mask, types=None):
    args = [torch.from_numpy(ids), torch.from_numpy(mask)] + ([torch.from_numpy(types)] if types is not None else [])
    with torch.inference_mode():
        return {k: v.float().numpy() for k, v in model(*args).items()}


def test_the_gate_passed_on_every_grid_case_and_the_file_says_right(files):
    for name, (path, _, report) in files.items():
        assert report["passed"], name
        paddings = {case["padding"] for case in report["cases"]}
        assert {"left", "random+empty"} <= paddings, paddings  # rows the Runtime right-aligns were gated too
        assert report["worst"]["last_hidden_state"]["max_abs"] <= 1e-4
        proto = onnx.load(str(path))
        meta = {p.key: p.value for p in proto.metadata_props}
        assert meta[contract.META_PADDING] == "right"
        assert json.loads(meta[contract.META_PARITY])["passed"]


def test_attention_takes_key_lengths_not_the_mask(files):
    """Every MultiHeadAttention's key_padding_mask is produced from a per-row sum (1-D), never the (B, N) Cast."""
    proto = onnx.load(str(files["learned"][0]))
    inferred = onnx.shape_inference.infer_shapes(proto)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info}
    producers = {out: node.op_type for node in proto.graph.node for out in node.output}
    attention = [n for n in proto.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(attention) == CONFIGS["learned"].num_layers
    for node in attention:
        mask = node.input[4]
        assert producers[mask] == "Max"
        assert ranks.get(mask, 1) == 1


def test_any_padding_file_still_takes_the_2d_mask(tokens_model):
    proto = onnx.load(str(tokens_model))
    producers = {out: node.op_type for node in proto.graph.node for out in node.output}
    masks = [producers[n.input[4]] for n in proto.graph.node if n.op_type == "MultiHeadAttention"]
    assert masks and set(masks) == {"Cast"}
    assert contract.META_PADDING not in {p.key for p in proto.metadata_props}


def batch_of(rows, n, padding, rng, vocab):
    """rows of ids placed in a (B + 1, n) batch with noise under the padding, plus one fully padded row."""
    ids = rng.integers(0, vocab, size=(len(rows) + 1, n))
    mask = np.zeros(ids.shape, np.int64)
    for i, row in enumerate(rows):
        where = {"right": np.arange(len(row)), "left": np.arange(n - len(row), n)}.get(padding)
        if where is None:
            where = np.sort(rng.choice(n, size=len(row), replace=False))
        ids[i, where], mask[i, where] = row, 1
    return ids, mask


@pytest.mark.parametrize("name", ["learned", "rotary"])
def test_run_given_left_and_scattered_rows_equals_each_row_alone(files, name):
    """Padding invariance through Runtime.run: left-padded and scattered rows, given to run()
    directly, give each kept token what the row alone gives (positions counted from its first
    kept token), with other rows of other lengths and a fully padded row in the batch."""
    path, model, _ = files[name]
    rt = Runtime(path, "cpu")
    rng = np.random.default_rng(5)
    worst = 0.0
    for n in (3, 17, 64):
        rows = [rng.integers(0, 100, size=length) for length in sorted({n, max(1, n // 2), 1})]
        alone = [eager(model, row[None], np.ones((1, len(row)), np.int64)) for row in rows]
        for padding in ("right", "left", "scattered"):
            ids, mask = batch_of(rows, n, padding, rng, 100)
            out = rt.run(input_ids=ids, attention_mask=mask)
            assert np.isfinite(out["last_hidden_state"]).all()
            for i, want in enumerate(alone):
                kept = out["last_hidden_state"][i][mask[i] == 1]
                worst = max(worst, float(np.abs(kept - want["last_hidden_state"][0]).max()))
                pooled = out["sentence_embedding"][i] - want["sentence_embedding"][0]
                worst = max(worst, float(np.abs(pooled).max()))
    assert worst <= 1e-4, f"{name}: a kept token moved by {worst}"


def test_kept_positions_left_padding_equals_the_2d_mask_model(files):
    """With positions counted over kept tokens, right-aligning is exact: a left-padded and a
    scattered batch give what eager PyTorch gives on the very same (unaligned) inputs."""
    path, model, _ = files["kept"]
    rt = Runtime(path, "cpu")
    rng = np.random.default_rng(6)
    ids = rng.integers(0, 100, size=(3, 11))
    types = rng.integers(0, 2, size=(3, 11))
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0], [1] * 11], np.int64)
    got = rt.run(input_ids=ids, attention_mask=mask, token_type_ids=types)
    want = eager(model, ids, mask, types)
    keep = mask == 1
    assert np.abs(got["last_hidden_state"][keep] - want["last_hidden_state"][keep]).max() <= 1e-4
    assert np.abs(got["sentence_embedding"] - want["sentence_embedding"]).max() <= 1e-4


def test_embed_batches_equal_single_runs(files):
    """embed pads right itself (no aligning); its rows equal single-row runs."""
    rt = Runtime(files["learned"][0], "cpu")
    rng = np.random.default_rng(7)
    rows = [rng.integers(0, 100, size=length).tolist() for length in (1, 9, 30, 4, 64)]
    batched = rt.embed(rows, batch_size=3)
    singles = np.stack([rt.run(input_ids=[row])["sentence_embedding"][0] for row in rows])
    assert np.abs(batched - singles).max() <= 1e-5


def test_io_binding_path_equals_plain_run_with_aligning(files):
    """The CUDA path (IO binding) forced on the CPU gives the plain run's outputs for a key-length file."""
    rt = Runtime(files["learned"][0], "cpu")
    rng = np.random.default_rng(8)
    feeds = {contract.INPUT_IDS: rng.integers(0, 100, size=(4, 12)), contract.ATTENTION_MASK: np.ones((4, 12), np.int64),
             contract.TOKEN_TYPE_IDS: np.zeros((4, 12), np.int64)}
    feeds[contract.ATTENTION_MASK][1, 7:] = 0
    plain = rt._execute(feeds)
    bound = rt._run_bound(feeds, "cpu", 0)
    for name in plain:
        np.testing.assert_array_equal(bound[name], plain[name])


def test_alignment_permutes_and_restores():
    mask = np.array([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.int64)
    assert not right_padded(mask) and right_padded(mask[1:])
    perm = alignment(mask)
    x = np.arange(15).reshape(3, 5) * 10
    aligned = align_feeds({contract.ATTENTION_MASK: mask, contract.INPUT_IDS: x, contract.TASK_ID: np.arange(3)}, perm)
    np.testing.assert_array_equal(aligned[contract.ATTENTION_MASK], [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [0] * 5])
    np.testing.assert_array_equal(aligned[contract.INPUT_IDS][0], [10, 20, 40, 0, 30])
    np.testing.assert_array_equal(aligned[contract.TASK_ID], np.arange(3))  # no sequence axis: untouched
    features = np.random.default_rng(0).standard_normal((3, 5, 2))
    back = restore_outputs({"h": align_feeds({contract.ATTENTION_MASK: mask, "h": features}, perm)["h"],
                            "pooled": features[:, 0]}, perm, {"h"})
    np.testing.assert_array_equal(back["h"], features)
    np.testing.assert_array_equal(back["pooled"], features[:, 0])
    assert alignment(mask[1:]) is None


def test_cuda_session_asks_for_cudnn_only_for_key_length_files():
    def options(key_lengths):
        return dict(provider_list("cuda", 0, key_lengths=key_lengths)[0][1])
    assert options(True)["sdpa_kernel"] == str(KEY_LENGTH_SDPA_KERNELS)
    assert KEY_LENGTH_SDPA_KERNELS & 8 and KEY_LENGTH_SDPA_KERNELS & 16  # cuDNN flash on, unfused kept
    assert "sdpa_kernel" not in options(False)


def test_refused_combinations(tmp_path):
    cfg = preset("tiny")
    with pytest.raises(ExportError, match="fused_ops=False"):
        export(cfg, tmp_path / "a.onnx", graph=GraphOptions(padding="right", fused_ops=False))
    with pytest.raises(ExportError, match="quantize"):
        export(cfg, tmp_path / "b.onnx", graph=GraphOptions(padding="right", quantize="int8"))
    with pytest.raises(ExportError, match="choose one of any, right"):
        export(cfg, tmp_path / "c.onnx", graph=GraphOptions(padding="left"))
    with pytest.raises(ExportError, match="has none"):
        export(preset("tiny", attention="linear"), tmp_path / "d.onnx", graph=GraphOptions(padding="right"))
    assert not list(tmp_path.iterdir())


def test_reader_refuses_an_unknown_padding_value(files, tmp_path):
    proto = onnx.load(str(files["learned"][0]))
    for prop in proto.metadata_props:
        if prop.key == contract.META_PADDING:
            prop.value = "left"
    bad = tmp_path / "bad.onnx"
    onnx.save(proto, str(bad))
    with pytest.raises(ModelFileError, match="valid: 'right'"):
        Runtime(bad, "cpu")


def test_float16_key_length_export_passes_the_float16_gate(tmp_path):
    model = build_encoder(CONFIGS["learned"], seed=3)
    result = export(model, tmp_path / "half.onnx", graph=GraphOptions(dtype="float16", padding="right"))
    assert result.report["passed"] and result.report["dtype"] == "float16"
    rt = Runtime(tmp_path / "half.onnx", "cpu")
    rng = np.random.default_rng(9)
    row = rng.integers(0, 100, size=6)
    ids, mask = batch_of([row], 10, "left", rng, 100)
    got = rt.run(input_ids=ids, attention_mask=mask)["last_hidden_state"][0][mask[0] == 1]
    want = eager(model, row[None], np.ones((1, 6), np.int64))["last_hidden_state"][0]
    cosine = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cosine.min() >= 0.999


def test_cli_padding_right_writes_the_key(tmp_path):
    from support.cli import fail_stderr, invoke

    out = tmp_path / "m.onnx"
    invoke("export", "--preset", "tiny", "--padding", "right", "--no-parity", "-o", out)
    assert Runtime(out, "cpu").model_file.right_padding
    # `ortformer check` reruns the grid, its left and random cases right-aligned as at export
    invoke("check", out)  # exit 0: passed (a left-padded row read as key lengths would fail it)
    assert "--no-fused-ops has none" in fail_stderr("export", "--preset", "tiny", "--padding", "right", "--no-fused-ops",
                                                    "-o", tmp_path / "x.onnx", code=2)


def test_triton_refuses_a_key_length_file(files, tmp_path):
    from ortformer.core.errors import OutputError
    from ortformer.scale.triton import write_triton_repo

    with pytest.raises(OutputError, match="padding any for Triton"):
        write_triton_repo(files["learned"][0], tmp_path / "repo")
    assert not (tmp_path / "repo" / "model").exists()
