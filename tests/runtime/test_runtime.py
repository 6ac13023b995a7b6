"""Runtime against eager PyTorch, providers, options, IO binding, embed and threads."""
import threading
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from support.exported_models import CONFIGS

from ortformer import contract
from ortformer.core.errors import InputError, ProviderError
from ortformer.contract.parity import GATES, compare, grid, make_inputs, passes
from ortformer.runtime import ProviderFallbackWarning, Runtime
from ortformer.runtime.validate import check_inputs


def eager(kind: str, inputs: dict) -> dict:
    torch = pytest.importorskip("torch")
    from ortformer.models import build_encoder

    model = build_encoder(CONFIGS[kind], seed=0)  # the exporter's seed-0 weights
    names = contract.input_names(CONFIGS[kind])
    with torch.inference_mode():
        out = model(*(torch.from_numpy(inputs[n]) for n in names))
    return {k: v.numpy() for k, v in out.items()}


def padded_batch(rng, cfg, batch=3, length=9):
    mask = (np.arange(length)[None, :] < rng.integers(1, length + 1, size=batch)[:, None]).astype(np.int64)
    inputs = {contract.ATTENTION_MASK: mask}
    if cfg.takes_ids:
        inputs[contract.INPUT_IDS] = rng.integers(0, cfg.vocab_size, size=(batch, length))
    else:
        inputs[contract.INPUTS_EMBEDS] = rng.standard_normal((batch, length, cfg.hidden_size)).astype(np.float32)
    if cfg.type_vocab_size:
        inputs[contract.TOKEN_TYPE_IDS] = rng.integers(0, cfg.type_vocab_size, size=(batch, length))
    return inputs


@pytest.mark.parametrize("kind", ["tokens", "features"])
def test_matches_eager_pytorch(request, rng, kind):
    rt = request.getfixturevalue(f"{kind}_rt")
    inputs = padded_batch(rng, rt.config)
    got, want = rt.run(**inputs), eager(kind, inputs)
    assert set(got) == set(want) == set(contract.output_names(rt.config))
    keep = inputs[contract.ATTENTION_MASK].astype(bool)
    np.testing.assert_allclose(got["last_hidden_state"][keep], want["last_hidden_state"][keep], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got["sentence_embedding"], want["sentence_embedding"], atol=1e-4, rtol=0)
    assert got["last_hidden_state"].dtype == np.float32


def test_exposes_metadata(tokens_rt, tokens_model):
    assert tokens_rt.config == CONFIGS["tokens"]
    assert tokens_rt.path == tokens_model
    assert tokens_rt.provider == "cpu" and tokens_rt.device_id is None
    assert tokens_rt.source == "random-init:seed=0"
    assert tokens_rt.parity == {"skipped": True, "reason": "parity disabled by the caller", "dtype": "float32"}
    assert tokens_rt.metadata[contract.META_FORMAT] == contract.FORMAT
    assert tokens_rt.input_names == contract.input_names(tokens_rt.config)
    assert tokens_rt.output_names == contract.output_names(tokens_rt.config)


def test_lists_and_safe_integer_types_give_the_same_result(tokens_rt, rng):
    ids = rng.integers(0, 100, size=(2, 6))
    want = tokens_rt.run(input_ids=ids)
    for variant in (ids.tolist(), ids.astype(np.int32), ids.astype(np.uint8), ids.astype(np.int16)):
        got = tokens_rt.run(input_ids=variant, attention_mask=np.ones((2, 6), np.uint8))
        np.testing.assert_array_equal(got["sentence_embedding"], want["sentence_embedding"])


def test_defaults_are_all_ones_mask_and_zero_types(tokens_rt, rng):
    ids = rng.integers(0, 100, size=(2, 5))
    explicit = tokens_rt.run(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    default = tokens_rt.run(input_ids=ids)
    np.testing.assert_array_equal(default["last_hidden_state"], explicit["last_hidden_state"])
    ones = tokens_rt.run(input_ids=ids, token_type_ids=np.ones_like(ids))
    assert not np.allclose(ones["last_hidden_state"], default["last_hidden_state"])  # types matter
    bool_mask = tokens_rt.run(input_ids=ids, attention_mask=np.array([[True] * 5, [True, True, False, False, False]]))
    int_mask = tokens_rt.run(input_ids=ids, attention_mask=[[1] * 5, [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(bool_mask["sentence_embedding"], int_mask["sentence_embedding"])


def test_float_features_cast_to_float32(features_rt, rng):
    x = rng.standard_normal((2, 4, 32))
    np.testing.assert_array_equal(
        features_rt.run(inputs_embeds=x)["sentence_embedding"],
        features_rt.run(inputs_embeds=x.astype(np.float32))["sentence_embedding"],
    )


def test_io_binding_path_equals_plain_run(tokens_rt, rng):
    """The CUDA path's IO binding logic, exercised on the CPU device."""
    feeds = check_inputs(tokens_rt._spec, padded_batch(rng, tokens_rt.config))
    plain = tokens_rt._execute(feeds)
    bound = tokens_rt._run_bound(feeds, "cpu", 0)
    assert list(bound) == tokens_rt.output_names
    for name in plain:
        np.testing.assert_array_equal(bound[name], plain[name])
    one = tokens_rt._run_bound(feeds, "cpu", 0, ["sentence_embedding"])  # what embed asks for
    assert list(one) == ["sentence_embedding"]
    np.testing.assert_array_equal(one["sentence_embedding"], plain["sentence_embedding"])


def test_session_options_bound_memory_and_set_threads(tokens_model):
    options = Runtime(tokens_model, "cpu", threads=1)._session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    # workers spin between the ops of a run, briefly, and sleep once it returns
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.intra_op.spin_duration_us") == "20"
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"


def assert_within_float32_gate(new: Runtime, old: Runtime) -> None:
    """Every output of ``new`` within the float32 gate of ``old``'s over the parity grid."""
    rng = np.random.default_rng(0)
    for case in grid(new.config):
        inputs = make_inputs(new.config, case, rng)
        got, want = new.run(**inputs), old.run(**inputs)
        for name in want:
            metrics = compare(name, got[name], want[name], inputs[contract.ATTENTION_MASK])
            assert passes(metrics, GATES["float32"]), (case, name, metrics)


@pytest.mark.parametrize("model", ["tokens_model", "text_model"])
def test_the_bounded_spin_gives_the_unbounded_spins_outputs(model, request):
    """The defaults before the spin was bounded (session.intra_op.spin_duration_us unset), against
    today's, at 2 threads over the parity grid: within the float32 gate (scheduling moves no number)."""
    path = request.getfixturevalue(model)
    before = ort.SessionOptions()
    before.enable_mem_pattern = before.enable_cpu_mem_arena = False
    before.add_session_config_entry("session.intra_op.allow_spinning", "1")
    before.add_session_config_entry("session.force_spinning_stop", "1")
    old, new = Runtime(path, "cpu", threads=2, session_options=before), Runtime(path, "cpu", threads=2)
    assert new._session.get_session_options().get_session_config_entry("session.intra_op.spin_duration_us") == "20"
    assert_within_float32_gate(new, old)


@pytest.mark.parametrize("model", ["tokens_model", "text_model"])
def test_cpu_sessions_leave_skip_layer_norm_unfused_and_keep_the_fused_outputs(model, request, tmp_path, monkeypatch):
    """int8_kernels.CPU_DISABLED_FUSIONS: a CPU Runtime's graph keeps Add + LayerNormalization where
    onnxruntime would fuse them into SkipLayerNormalization (its CPU kernel measured slower), and
    gives the fused graph's outputs within the float32 gate over the parity grid."""
    from collections import Counter

    import onnx

    from ortformer.modelfile import int8_kernels

    path = request.getfixturevalue(model)

    def opened(name):
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{name}.onnx")  # the graph the session runs
        runtime = Runtime(path, "cpu", threads=2, session_options=options)
        return runtime, Counter(node.op_type for node in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node)

    new, new_ops = opened("new")
    monkeypatch.setattr(int8_kernels, "CPU_DISABLED_FUSIONS", ())
    old, old_ops = opened("old")
    assert old_ops["SkipLayerNormalization"] > 0  # onnxruntime fuses this model when let
    assert new_ops["SkipLayerNormalization"] == 0 and new_ops["LayerNormalization"] >= old_ops["SkipLayerNormalization"]
    assert_within_float32_gate(new, old)


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"provider": "tpu"}, ProviderError, "choose one of auto, cpu, cuda, openvino"),
        ({"device_id": -1}, ProviderError, "device_id=-1"),
        ({"threads": 0}, InputError, "threads=0"),
    ],
)
def test_bad_arguments(tokens_model, kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        Runtime(tokens_model, **kwargs)


def test_cuda_without_cuda_is_a_provider_error(tokens_model, cuda_usable):
    if cuda_usable:
        pytest.skip("CUDA really loads here")
    with pytest.raises(ProviderError, match="provider 'cuda' was requested") as info:
        Runtime(tokens_model, "cuda")
    assert "allow_fallback" in str(info.value)


def test_cuda_fallback_warns_and_runs_on_cpu(tokens_model, tokens_rt, cuda_usable):
    if cuda_usable:
        pytest.skip("CUDA really loads here")
    with pytest.warns(ProviderFallbackWarning, match="running on CPU"):
        rt = Runtime(tokens_model, "cuda", allow_fallback=True)
    assert rt.provider == "cpu" and rt.device_id is None
    np.testing.assert_array_equal(rt.run(input_ids=[[1, 2]])["sentence_embedding"],
                                  tokens_rt.run(input_ids=[[1, 2]])["sentence_embedding"])


def test_auto_prints_nothing_in_a_fresh_process(tokens_model):
    """onnxruntime logs a failed CUDA load in red on stderr; "auto" checks the provider
    library first and does not try what cannot load."""
    import subprocess
    import sys

    code = f"from ortformer.runtime import Runtime; print(Runtime({str(tokens_model)!r}).provider)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() in ("cpu", "cuda")
    assert done.stderr == ""


def test_auto_is_silent(tokens_model, cuda_usable):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt = Runtime(tokens_model, "auto")
    assert rt.provider == ("cuda" if cuda_usable else "cpu")


# --- embed ---------------------------------------------------------------------------

def test_embed_pooled_in_caller_order_equals_unbatched(tokens_rt, rng):
    sequences = [rng.integers(0, 100, size=n).tolist() for n in rng.integers(1, 20, size=13)]
    got = tokens_rt.embed(sequences, batch_size=4)
    assert got.shape == (13, 32) and got.dtype == np.float32
    for i, sequence in enumerate(sequences):
        want = tokens_rt.run(input_ids=[sequence])["sentence_embedding"][0]
        np.testing.assert_allclose(got[i], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["nopool", "features"])
def test_embed_token_states_in_caller_order(request, rng, kind):
    rt = request.getfixturevalue(f"{kind}_rt")
    lengths = rng.integers(1, 15, size=9)
    if rt.config.takes_ids:
        sequences = [rng.integers(0, 100, size=n) for n in lengths]
    else:
        sequences = [rng.standard_normal((n, 32)).astype(np.float32) for n in lengths]
    got = rt.embed(sequences, batch_size=3, output="last_hidden_state")
    assert [g.shape for g in got] == [(n, 32) for n in lengths]
    for sequence, g in zip(sequences, got):
        want = rt.run(**{rt.main_input: sequence[None]})["last_hidden_state"][0]
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


def test_embed_defaults_and_edges(tokens_rt, nopool_rt):
    assert isinstance(nopool_rt.embed([[1, 2]]), list)  # no pooling: token states by default
    assert tokens_rt.embed([]).shape == (0, 32)
    with pytest.raises(InputError, match="sentence_embedding"):
        nopool_rt.embed([[1]], output="sentence_embedding")
    with pytest.raises(InputError, match=r"sequence 2: input_ids\[1\] = 100 "):  # the place within that sequence
        tokens_rt.embed([[1], [2], [3, 100]])
    with pytest.raises(InputError, match="sequence 1: input_ids is empty"):
        tokens_rt.embed([[1], []])
    with pytest.raises(InputError, match="sequence 0 has shape"):
        tokens_rt.embed([[[1, 2]]])
    with pytest.raises(InputError, match="batch_size=0"):
        tokens_rt.embed([[1]], batch_size=0)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(InputError, match="max_tokens"):
            tokens_rt.embed([[1]], max_tokens=bad)


def test_embed_with_own_attention_equals_run_with_that_mask(tokens_rt, rng):
    """attention: each sequence's own 0/1 mask (a ColBERT query's unattended expansion tokens),
    batched by length and padded with zeros, gives what run() gives that sequence with that mask;
    embed_outputs hands back several outputs of the same runs."""
    sequences = [rng.integers(0, 100, size=n) for n in (4, 9, 6, 9, 2)]
    masks = [np.r_[np.ones(max(1, n - 2), np.int64), np.zeros(n - max(1, n - 2), np.int64)] for n in (4, 9, 6, 9, 2)]
    got = tokens_rt.embed_outputs(sequences, ["sentence_embedding", "last_hidden_state"], batch_size=2,
                                  attention=masks)
    for i, (sequence, mask) in enumerate(zip(sequences, masks)):
        want = tokens_rt.run(input_ids=sequence[None], attention_mask=mask[None])
        np.testing.assert_allclose(got["sentence_embedding"][i], want["sentence_embedding"][0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(got["last_hidden_state"][i], want["last_hidden_state"][0], atol=1e-5, rtol=0)
    ones = tokens_rt.embed(sequences, batch_size=2)
    assert not np.allclose(got["sentence_embedding"][1], ones[1], atol=1e-3)  # the mask was really applied
    with pytest.raises(InputError, match="one 0/1 mask per sequence"):
        tokens_rt.embed(sequences, attention=masks[:2])
    with pytest.raises(InputError, match="sequence 1: attention_mask"):
        tokens_rt.embed(sequences[:2], attention=[masks[0], masks[1][:3]])  # not the sequence's length
    with pytest.raises(InputError, match="sequence 0: attention_mask"):
        tokens_rt.embed(sequences[:1], attention=[np.full(4, 2)])


def test_embed_fetches_only_the_output_it_returns(tokens_rt, rng, monkeypatch):
    """embed asks onnxruntime for the one output it hands back (no copy and no finiteness
    scan of last_hidden_state when sentence embeddings are wanted); run() still gets all."""
    asked = []
    real_session = tokens_rt._session

    class Spy:
        def __getattr__(self, name):
            return getattr(real_session, name)

        def run(self, names, feeds, options=None):
            asked.append(list(names))
            return real_session.run(names, feeds, options)

    monkeypatch.setattr(tokens_rt, "_session", Spy())
    sequences = [rng.integers(0, 100, size=n).tolist() for n in (3, 7, 5)]
    pooled = tokens_rt.embed(sequences, batch_size=2)
    states = tokens_rt.embed(sequences, batch_size=2, output="last_hidden_state")
    full = tokens_rt.run(input_ids=[sequences[0]])
    assert asked == [["sentence_embedding"]] * 2 + [["last_hidden_state"]] * 2 + [tokens_rt.output_names]
    np.testing.assert_allclose(pooled[0], full["sentence_embedding"][0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(states[0], full["last_hidden_state"][0], atol=1e-5, rtol=0)


def test_embed_token_budget_gives_the_same_results(tokens_rt, rng, monkeypatch):
    """max_tokens changes only how sequences are grouped, never what comes back; the CPU
    default is CPU_TOKENS_PER_THREAD per thread."""
    from ortformer.runtime import batching, session

    sequences = [rng.integers(0, 100, size=n).tolist() for n in rng.integers(1, 40, size=17)]
    seen, counts = [], []

    def spy(lengths, batch_size, max_tokens=None):
        seen.append(max_tokens)
        batches = batching.length_batches(lengths, batch_size, max_tokens)
        counts.append(len(batches))
        return batches

    monkeypatch.setattr(session, "length_batches", spy)
    loose = tokens_rt.embed(sequences, batch_size=32, max_tokens=10_000)
    tight = tokens_rt.embed(sequences, batch_size=32, max_tokens=7)  # most sequences alone
    tokens_rt.embed(sequences)
    np.testing.assert_allclose(tight, loose, atol=1e-5, rtol=0)
    assert seen == [10_000, 7, session.CPU_TOKENS_PER_THREAD * tokens_rt.threads]
    assert counts[0] == 1 and counts[1] > 10  # the budget really regrouped the sequences


def test_threads_are_what_was_asked_or_the_usable_cores(tokens_model):
    from ortformer.core.cpus import available_cpus

    assert Runtime(tokens_model, "cpu", threads=3).threads == 3
    assert Runtime(tokens_model, "cpu").threads == available_cpus()  # affinity, capped by a cgroup quota


# --- threads -------------------------------------------------------------------------

def test_one_runtime_shared_by_threads(tokens_rt):
    rng = np.random.default_rng(1)
    shapes = [(int(b), int(n)) for b, n in zip(rng.integers(1, 4, size=50), rng.integers(1, 20, size=50))]
    batches = [rng.integers(0, 100, size=shape) for shape in shapes]
    masks = [(rng.random(shape) < 0.8).astype(np.int64) for shape in shapes]
    expected = [tokens_rt.run(input_ids=ids, attention_mask=m)["last_hidden_state"] for ids, m in zip(batches, masks)]
    failures = []

    def worker(offset: int) -> None:
        for k in range(50):
            i = (k + offset * 7) % 50  # threads run the shapes in different orders
            got = tokens_rt.run(input_ids=batches[i], attention_mask=masks[i])["last_hidden_state"]
            if not np.array_equal(got, expected[i]):
                failures.append((offset, i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
