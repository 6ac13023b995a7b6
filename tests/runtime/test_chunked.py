"""Chunked runs and streaming: chunk stages == whole graph == eager PyTorch, with padding."""
from __future__ import annotations

import base64
import json

import numpy as np
import onnx
import pytest

from ortformer import contract
from ortformer.config import preset
from ortformer.core.errors import InputError, ModelFileError
from ortformer.exporter.export import eager_runner
from ortformer.models import build_encoder
from ortformer.contract.parity import GATES, Case, compare, make_inputs
from ortformer.runtime import Runtime, read_model_file

CHUNK = 16
BASE = dict(hidden_size=32, num_heads=4, num_layers=2, ffn_size=64, max_positions=128, norm_eps=1e-5)
CONFIGS = {
    # ids with token types, post-norm, learned positions, mean pooling; gated at export
    "linear": preset("tiny", attention="linear", **BASE),
    # features, pre-norm (a final stage), sinusoids computed per chunk, cls pooling
    "efficient": preset("tiny", attention="efficient", vocab_size=0, type_vocab_size=0, norm_position="pre",
                        positions="sinusoidal", pooling="cls", **BASE),
    # ids, pre-norm, no positions, normalised mean pooling
    "cosine": preset("tiny", attention="cosine", type_vocab_size=0, norm_position="pre", positions="none",
                     normalize_embeddings=True, **BASE),
    # ids with token types: streamed chunks get type 0, as run() does
    "causal_linear": preset("tiny", attention="linear", causal=True, pooling="none", **BASE),
    "causal_cosine": preset("tiny", attention="cosine", causal=True, vocab_size=0, type_vocab_size=0,
                            positions="sinusoidal", norm_position="pre", pooling="none", **BASE),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from ortformer.exporter import export

    folder = tmp_path_factory.mktemp("chunked")
    paths = {}

    def get(kind):
        if kind not in paths:
            paths[kind] = folder / f"{kind}.onnx"
            export(CONFIGS[kind], paths[kind], parity=kind == "linear")
        return paths[kind]

    return get


def _check(got, want, mask):
    for name in want:
        m = compare(name, got[name], want[name], mask)
        assert m["max_abs"] <= GATES["float32"]["max_abs"] and m["min_cosine"] >= GATES["float32"]["min_cosine"], (name, m)


@pytest.mark.parametrize("kind", ["linear", "efficient", "cosine", "causal_linear", "causal_cosine"])
def test_chunked_equals_whole_graph_and_eager(models, kind):
    cfg = CONFIGS[kind]
    path = models(kind)
    chunked, whole = Runtime(path, "cpu", chunk_size=CHUNK), Runtime(path, "cpu", chunk_size=1024)
    eager = eager_runner(build_encoder(cfg))
    rng = np.random.default_rng(0)
    for case in (Case(1, 3 * CHUNK + 5, "none"), Case(2, 50, "right"), Case(2, 50, "left"), Case(3, 41, "random+empty")):
        inputs = make_inputs(cfg, case, rng)
        got, ref = chunked.run(**inputs), whole.run(**inputs)
        _check(got, ref, inputs[contract.ATTENTION_MASK])
        _check(got, eager(inputs), inputs[contract.ATTENTION_MASK])
        empty = ~inputs[contract.ATTENTION_MASK].astype(bool).any(axis=1)
        for name in got:
            assert np.isfinite(got[name]).all()
            if name == contract.SENTENCE_EMBEDDING and empty.any():  # rows the metrics skip
                assert np.abs(got[name][empty] - ref[name][empty]).max() <= GATES["float32"]["max_abs"]


def test_far_positions_meet_the_float32_gate(tmp_path):
    """Sinusoids at positions in the tens of thousands, five chunks long: onnxruntime (chunked and whole)
    within the float32 gate of eager PyTorch, and eager float32 within it of a float64 reference.

    An angle p * f turns by p times any difference in f: frequencies computed by each engine's own
    float32 Exp differed in the last place, and at p ~ 20,000 that alone put 5e-4 between them."""
    from ortformer.exporter import export

    n, chunk = 20_000, 4096
    cfg = preset("tiny", attention="linear", vocab_size=0, type_vocab_size=0, positions="sinusoidal",
                 **{**BASE, "num_layers": 1, "max_positions": 1 << 20})
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = build_encoder(cfg).eval()
    path = tmp_path / "far.onnx"
    export(model, path, parity=False)
    inputs = make_inputs(cfg, Case(1, n, "none"), np.random.default_rng(5))
    want = eager_runner(model)(inputs)
    chunked = Runtime(path, "cpu", chunk_size=chunk).run(**inputs)
    mask = inputs[contract.ATTENTION_MASK]
    _check(chunked, want, mask)
    _check(Runtime(path, "cpu", chunk_size=n).run(**inputs), want, mask)
    with torch.no_grad():
        exact = model.double()(torch.from_numpy(inputs[contract.INPUTS_EMBEDS]).double(), torch.from_numpy(mask))
    _check({contract.LAST_HIDDEN_STATE: exact[contract.LAST_HIDDEN_STATE].float().numpy()},
           {contract.LAST_HIDDEN_STATE: want[contract.LAST_HIDDEN_STATE]}, mask)


def test_export_gates_the_chunked_path(models):
    report = read_model_file(models("linear")).parity
    assert report["passed"] and report["chunked"]["passed"]
    assert report["chunked"]["cases"] and all(c["sequence"] > report["chunked"]["chunk_size"] for c in report["chunked"]["cases"])


def test_out_buffer_and_memmap(models, tmp_path):
    cfg = CONFIGS["linear"]
    rt = Runtime(models("linear"), "cpu", chunk_size=CHUNK)
    inputs = make_inputs(cfg, Case(2, 40, "right"), np.random.default_rng(1))
    want = rt.run(**inputs)
    mm = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype=np.float32, shape=(2, 40, cfg.hidden_size))
    got = rt.run(**inputs, out=mm)
    assert got[contract.LAST_HIDDEN_STATE] is mm
    mm.flush()
    assert np.array_equal(np.load(tmp_path / "out.npy"), want[contract.LAST_HIDDEN_STATE])
    short = np.zeros((2, 10, cfg.hidden_size), np.float32)  # the whole-graph path fills out= too
    got = rt.run(**make_inputs(cfg, Case(2, 10, "none"), np.random.default_rng(2)), out=short)
    assert got[contract.LAST_HIDDEN_STATE] is short and short.any()
    with pytest.raises(InputError, match="float32"):
        rt.run(**inputs, out=np.zeros((2, 40, cfg.hidden_size)))
    with pytest.raises(InputError, match="shape"):
        rt.run(**inputs, out=np.zeros((2, 41, cfg.hidden_size), np.float32))


@pytest.mark.parametrize("kind", ["causal_linear", "causal_cosine"])
def test_stream_equals_the_full_causal_run(models, kind):
    cfg = CONFIGS[kind]
    rt = Runtime(models(kind), "cpu")
    inputs = make_inputs(cfg, Case(1, 120, "none"), np.random.default_rng(3))
    sequence = inputs[rt.main_input][0]
    full = rt.run(**{rt.main_input: sequence[None]})[contract.LAST_HIDDEN_STATE][0]
    for size in (1, 3, 100):
        parts = list(rt.stream(sequence[s:s + size] for s in range(0, len(sequence), size)))
        assert [len(p) for p in parts] == [len(sequence[s:s + size]) for s in range(0, len(sequence), size)]
        assert np.abs(np.concatenate(parts) - full).max() <= GATES["float32"]["max_abs"]
    batched = list(rt.stream([inputs[rt.main_input][:, :50], inputs[rt.main_input][:, 50:]]))
    assert np.abs(np.concatenate(batched, axis=1)[0] - full).max() <= GATES["float32"]["max_abs"]


def test_stream_refusals(models):
    with pytest.raises(InputError, match="causal"):
        next(Runtime(models("linear"), "cpu").stream([[1, 2]]))
    rt = Runtime(models("causal_linear"), "cpu")
    with pytest.raises(InputError, match="chunk 1"):
        list(rt.stream([[1, 2], [1, 10_000]]))
    with pytest.raises(InputError, match="rows"):
        list(rt.stream([[[1, 2]], [[1, 2], [3, 4]]]))
    with pytest.raises(InputError, match="position table"):  # learned positions bound the stream
        list(rt.stream([[1] * 100, [1] * 29]))


def test_chunk_size_is_checked(models):
    with pytest.raises(InputError, match="chunk_size"):
        Runtime(models("linear"), "cpu", chunk_size=0)


def _tampered(path, tmp_path, change):
    model = onnx.load(str(path))
    entry = next(p for p in model.metadata_props if p.key == contract.META_CHUNKED)
    data = json.loads(entry.value)
    change(data)
    entry.value = json.dumps(data)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    return bad


def test_model_file_reader_checks_the_payload(models, tmp_path):
    path = models("linear")

    def wrong_target(d):
        d["weights"]["layer.0"]["attention.qkv.weight"] = ["no_such_tensor", True]

    def transposed(d):
        name, flag = d["weights"]["layer.0"]["attention.qkv.weight"]
        d["weights"]["layer.0"]["attention.qkv.weight"] = [name, not flag]

    def weight_inside(d):
        stage = onnx.load_from_string(base64.b64decode(d["graphs"]["stats"]))
        stage.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((100, 100), np.float32), "big"))
        d["graphs"]["stats"] = base64.b64encode(stage.SerializeToString()).decode()

    for change, message in ((wrong_target, "not a float32 initializer"), (transposed, "the stage declares"),
                            (weight_inside, "take their weights as inputs"),
                            (lambda d: d.update(mode="step"), "mode"),
                            (lambda d: d["graphs"].pop("apply"), "stages"),
                            (lambda d: d.update(chunk_size=10**6), "chunk_size")):
        with pytest.raises(ModelFileError, match=message):
            read_model_file(_tampered(path, tmp_path, change))


def test_infer_writes_npy_through_a_memmap(models, tmp_path):
    from click.testing import CliRunner

    from ortformer.cli import cli

    cfg = CONFIGS["linear"]
    inputs = make_inputs(cfg, Case(2, 40, "none"), np.random.default_rng(4))
    np.save(tmp_path / "ids.npy", inputs[contract.INPUT_IDS])
    result = CliRunner().invoke(cli, ["infer", str(models("linear")), "--input", str(tmp_path / "ids.npy"),
                                      "--tensor", "last_hidden_state", "-o", str(tmp_path / "x.npy")])
    assert result.exit_code == 0, result.output
    want = Runtime(models("linear"), "cpu").run(input_ids=inputs[contract.INPUT_IDS])[contract.LAST_HIDDEN_STATE]
    assert np.array_equal(np.load(tmp_path / "x.npy"), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.npy", "x.npy"]  # no temporary left behind


def test_chunk_stages_run_on_the_runtimes_provider(models, monkeypatch):
    """A Runtime on CUDA asks for its chunk stages on CUDA, and refuses to run them on the CPU
    when CUDA does not come up (no GPU here: the stage sessions are faked around CPU ones)."""
    from types import SimpleNamespace

    import onnxruntime as ort

    from ortformer.core.errors import ProviderError
    from ortformer.runtime import chunked
    from ortformer.runtime.providers import CPU_EP, CUDA_EP

    asked, claimed = [], []
    real = ort.InferenceSession

    class Stage:
        """A CPU stage session that reports the providers in `claimed` (CUDA or not)."""

        def __init__(self, blob, options, providers):
            asked.append(providers)
            self.session = real(blob, options, providers=[CPU_EP])

        def get_providers(self):
            return claimed

        def __getattr__(self, name):
            return getattr(self.session, name)

    path = models("linear")
    monkeypatch.setattr(chunked, "ort", SimpleNamespace(InferenceSession=Stage, SessionOptions=ort.SessionOptions))
    rt = Runtime(path, "cpu", chunk_size=CHUNK)
    ids = np.random.default_rng(0).integers(0, rt.config.vocab_size, (2, 3 * CHUNK + 5))
    want = rt.run(input_ids=ids)[contract.LAST_HIDDEN_STATE]
    assert asked and all(p == [CPU_EP] for p in asked)  # a CPU runtime: CPU stages

    for claim in ([CPU_EP], [CUDA_EP, CPU_EP]):
        asked.clear()
        claimed[:] = claim
        gpu = Runtime(path, "cpu", chunk_size=CHUNK)
        gpu.provider, gpu.device_id = "cuda", 0  # as a Runtime that CUDA opened
        if claim[0] == CPU_EP:  # CUDA did not come up for the stages: refused, not run on the CPU
            with pytest.raises(ProviderError, match="not CUDA"):
                gpu.chunk_runner()
        else:
            np.testing.assert_array_equal(gpu.run(input_ids=ids)[contract.LAST_HIDDEN_STATE], want)
        assert asked and all(p[0][0] == CUDA_EP and p[-1] == CPU_EP for p in asked)
