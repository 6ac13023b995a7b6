"""Fuzzing Runtime.run and Runtime.embed with whatever a service might receive.

The guarantee: every call either returns finite outputs identical to a direct
onnxruntime run of the same input after validation (canonical int64/float32
arrays), or raises InputError. Any other exception, a NaN/inf returned, an
invalid input accepted or a valid one refused is a failure. After every call the
same Runtime still answers a fixed good request bit for bit.

Validity is decided by an oracle written here from the contract (ortformer/contract/__init__.py,
ortformer/runtime/validate.py docstring), independently of the runtime's own checks.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reliability import good_request, scaled

from ortformer import contract
from ortformer.core.errors import InputError

NAMES = (contract.INPUT_IDS, contract.INPUTS_EMBEDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS)
DTYPES = [
    np.dtype(t) for t in (
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "longdouble", "complex64", "complex128", "bool",
        "object", "U4", "S4", "datetime64[s]", "timedelta64[s]", ">i8", ">i4", ">u4", ">f4", ">f8",
    )
]
MODES = ("valid", "binary", "near", "extreme", "nonfinite", "huge", "overflow")
FORMS = ("array", "list", "ragged", "strided", "fortran", "readonly", "tuple")
ODD_VALUES = (None, 5, 2.5, "abc", b"\x00\x01", {"a": 1}, {1, 2}, object(), np.int64(3), [], [[]], [[[]]],
              [[1, "a"]], [[1, None]], [[1.5, 2]], [[True, False]], [[2**63]], [[-2**63 - 1]], [[2**64 - 1, 0]],
              [[1, [2]]], [[1, 2], 3])

# ---------------------------------------------------------------- generating inputs


def fill(dtype: np.dtype, shape: tuple, mode: str, cfg, rng: np.random.Generator) -> np.ndarray:
    """An array of `dtype`/`shape` whose values follow `mode` (valid ids, 0/1, extremes, NaN...)."""
    n = int(np.prod(shape))
    top = max(cfg.vocab_size, cfg.type_vocab_size, 2)
    if mode == "valid":
        values = rng.integers(0, top, size=n) if cfg.takes_ids else rng.standard_normal(n)
    elif mode == "binary":
        values = rng.integers(0, 2, size=n)
    elif mode == "near":  # just outside the valid ranges
        values = rng.choice([-1, 0, 1, 2, top - 1, top, top + 1], size=n)
    elif mode == "extreme":
        values = rng.choice([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max], size=n)
    elif mode == "nonfinite":
        values = rng.choice([np.nan, np.inf, -np.inf, 0.0, 1.0], size=n)
    elif mode == "huge":  # beyond float32, or tiny
        values = rng.choice([1e30, -3e38, 3.3e38, 1e300, 1e-45, 0.5], size=n)
    else:  # finite in float32, but overflowing the model's own arithmetic
        values = rng.choice([-3.3e38, -1e38, 1e38, 3.3e38], size=n)
    if dtype.kind == "O":
        pool = [1, 2, None, "x", 1.5, 2**70]
        values = np.array([pool[i] for i in rng.integers(0, len(pool), size=n)] if rng.random() < 0.5
                          else list(values.tolist()), dtype=object)
    elif dtype.kind in "US":
        values = values.astype(str)
    with np.errstate(all="ignore"):
        if dtype.kind in "Mm":
            values = np.nan_to_num(values.astype(np.float64), posinf=0, neginf=0).astype(np.int64)
        if dtype.kind in "iub" and np.asarray(values).dtype.kind == "f":
            values = np.nan_to_num(values, nan=0, posinf=1, neginf=-1)
        if dtype.kind in "iu":  # wrap-around casting is fine: it only adds more odd values
            values = np.asarray(values).astype(np.int64 if dtype.kind == "i" else np.uint64)
        return np.asarray(values).astype(dtype).reshape(shape)


def shapes(rank_hint: int, hidden: int, longest: int):
    dim = st.sampled_from([1, 1, 2, 3, 4, 5, 8, 0])
    sequence = st.one_of(dim, st.sampled_from([longest - 1, longest, longest + 1, longest + 7]))
    feature = st.sampled_from([hidden, hidden, hidden, hidden - 1, hidden + 1, 0, 1])

    @st.composite
    def build(draw):
        rank = draw(st.sampled_from([rank_hint] * 6 + [0, 1, 2, 3, 4]))
        if rank == 0:
            return ()
        if rank == 1:
            return (draw(sequence),)
        shape = [draw(dim), draw(sequence)] + [draw(dim) for _ in range(rank - 2)]
        if rank == 3 and rank_hint == 3:
            shape[2] = draw(feature)
        return tuple(shape)

    return build()


def shape_form(array: np.ndarray, form: str):
    """The same values handed over differently: list, ragged list, non-contiguous view..."""
    if form == "list" or (form in ("ragged", "tuple") and array.ndim == 0):
        return array.tolist()
    if form == "tuple":
        return tuple(array.tolist()) if array.ndim else array.tolist()
    if form == "ragged":
        rows = array.tolist()
        if isinstance(rows, list) and rows and isinstance(rows[0], list):
            rows[0] = rows[0][:-1] if rows[0] else [0]
        elif isinstance(rows, list):
            rows.append([1, 2])
        return rows
    if form == "strided" and array.ndim:
        doubled = np.repeat(array, 2, axis=-1)
        return doubled[..., ::2]
    if form == "fortran":
        return np.asfortranarray(array)
    if form == "readonly":
        array = array.copy()
        array.setflags(write=False)
    return array


@st.composite
def array_like(draw, cfg, rank_hint: int, shape=None):
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from(ODD_VALUES))
    dtype = draw(st.sampled_from(DTYPES + [np.dtype(np.int64)] * 4 + [np.dtype(np.float32)] * 4))
    if shape is None or draw(st.integers(0, 4)) == 0:
        shape = draw(shapes(rank_hint, cfg.hidden_size, cfg.max_positions))
    mode = draw(st.sampled_from(MODES + ("valid",) * 3))
    form = draw(st.sampled_from(FORMS + ("array",) * 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return shape_form(fill(dtype, shape, mode, cfg, rng), form)


@st.composite
def valid_array(draw, cfg, rank: int):
    """A main input the contract accepts, in any of the accepted dtypes and forms."""
    shape = (draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 3, 7, 16, cfg.max_positions])))
    if cfg.takes_ids:
        dtype = draw(st.sampled_from(["int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", ">i8"]))
    else:
        dtype = draw(st.sampled_from(["float32", "float64", "float16", ">f4", "longdouble"]))
        shape += (cfg.hidden_size,)
    shape = shape[-rank:]  # embed takes one sequence: (N,) or (N, F)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = fill(np.dtype(dtype), shape, "valid", cfg, rng)
    if values.dtype.kind in "iu":  # int8 wraps ids >= 128 negative: bring them back in range
        values = (values.astype(np.int64) % min(cfg.vocab_size, np.iinfo(values.dtype).max + 1)).astype(dtype)
    return shape_form(values, draw(st.sampled_from(["array", "list", "strided", "fortran", "readonly", "tuple"])))


@st.composite
def run_kwargs(draw, rt):
    cfg = rt.config
    main = rt.main_input
    rank = 2 if cfg.takes_ids else 3
    kwargs = {main: draw(st.one_of(valid_array(cfg, rank), array_like(cfg, rank)))}
    array = to_array(kwargs[main])
    batch_shape = array.shape[:2] if array is not None and array.ndim >= 2 else None
    for name, valid in ((contract.ATTENTION_MASK, "binary"), (contract.TOKEN_TYPE_IDS, "types")):
        choice = draw(st.sampled_from(["absent", "absent", "matching", "matching", "random"]))
        if choice == "matching" and batch_shape is not None and len(batch_shape) == 2:
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            top = 2 if valid == "binary" else max(cfg.type_vocab_size, 1)
            value = rng.integers(0, top, size=batch_shape)
            if valid == "binary" and batch_shape[0] and draw(st.booleans()):
                value[draw(st.integers(0, batch_shape[0] - 1))] = 0  # a fully padded row
            dtype = draw(st.sampled_from(["int64", "int32", "uint8", "bool", "float32"]))
            kwargs[name] = shape_form(value.astype(dtype), draw(st.sampled_from(FORMS)))
        elif choice == "random":
            kwargs[name] = draw(array_like(cfg, 2, shape=batch_shape))
    if draw(st.integers(0, 9)) == 0:
        extra = draw(st.sampled_from(["position_ids", "inputs", "mask", "input_ids", "inputs_embeds",
                                      "token_type_ids", "attention_mask", "héllo", "", "__class__"]))
        kwargs[extra] = draw(st.sampled_from([None, [[1, 2]], np.zeros((1, 2, cfg.hidden_size), np.float32)]))
    if draw(st.integers(0, 14)) == 0:
        kwargs[main] = None  # the main input missing
    return kwargs


# ---------------------------------------------------------------- the oracle


def to_array(value):
    """None when the value cannot be a rectangular numeric array."""
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            return None
    return None if array.dtype.kind not in "iufcbUSMm" else array


def safe_int(array) -> bool:
    return array.dtype.kind == "i" or (array.dtype.kind == "u" and array.dtype.itemsize <= 4)


def oracle(rt, kwargs: dict) -> dict | None:
    """The canonical graph feeds for a valid request; None when it must be refused."""
    cfg = rt.config
    if any(name not in NAMES for name in kwargs):
        return None
    given = {k: v for k, v in kwargs.items() if v is not None}
    if any(name not in rt.input_names for name in given) or rt.main_input not in given:
        return None
    main = to_array(given[rt.main_input])
    # zero rows of a real length is an empty batch, answered with zero rows; any other empty array is refused
    if main is None or (main.size == 0 and not (main.ndim >= 2 and main.shape[0] == 0 and all(main.shape[1:]))):
        return None
    if cfg.takes_ids:
        if main.ndim != 2 or not safe_int(main):
            return None
        feeds = {rt.main_input: main.astype(np.int64)}
        if ((feeds[rt.main_input] < 0) | (feeds[rt.main_input] >= cfg.vocab_size)).any():
            return None
    else:
        if main.ndim != 3 or main.dtype.kind != "f" or main.shape[2] != cfg.hidden_size:
            return None
        with np.errstate(over="ignore"):
            feeds = {rt.main_input: main.astype(np.float32)}
        if not np.isfinite(feeds[rt.main_input]).all():
            return None
    b, n = main.shape[:2]
    if n > cfg.max_positions:
        return None
    for name, default, top in ((contract.ATTENTION_MASK, 1, 2), (contract.TOKEN_TYPE_IDS, 0, cfg.type_vocab_size)):
        if name not in rt.input_names:
            continue
        if name not in given:
            feeds[name] = np.full((b, n), default, np.int64)
            continue
        array = to_array(given[name])
        if array is None or array.shape != (b, n):
            return None
        if not (safe_int(array) or (name == contract.ATTENTION_MASK and array.dtype.kind == "b")):
            return None
        array = array.astype(np.int64)
        if ((array < 0) | (array >= top)).any():
            return None
        feeds[name] = array
    return {k: np.ascontiguousarray(v) for k, v in feeds.items()}


def direct(rt, feeds: dict) -> dict:
    """onnxruntime itself, bypassing the Runtime's validation; for zero rows, the contract's
    declared shapes with a batch of 0 (the session is not asked)."""
    rows, length = feeds[contract.ATTENTION_MASK].shape if contract.ATTENTION_MASK in feeds else (1, 1)
    if rows == 0:
        return {name: np.zeros([0, *(length if axis == contract.SEQUENCE_AXIS else axis for axis in shape[1:])],
                               np.float32) for name, shape in contract.output_shapes(rt.config).items()}
    return dict(zip(rt.output_names, rt._session.run(rt.output_names, feeds)))


def finite(outputs: dict) -> bool:
    return all(np.isfinite(v).all() for v in outputs.values())


# ---------------------------------------------------------------- the properties

BASELINES: dict[int, tuple[dict, dict]] = {}


def still_healthy(rt) -> None:
    if id(rt) not in BASELINES:
        request = good_request(rt)
        BASELINES[id(rt)] = (request, direct(rt, oracle(rt, request)))
    request, want = BASELINES[id(rt)]
    got = rt.run(**request)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} changed after fuzzed calls")


def check_run(rt, kwargs: dict, figures, section: str) -> None:
    still_healthy(rt)
    figures.add(section, "inputs_tried")
    feeds = oracle(rt, kwargs)
    want = direct(rt, feeds) if feeds is not None else None
    try:
        got = rt.run(**kwargs)
    except InputError as exc:
        figures.add(section, "input_errors")
        if want is not None and finite(want):
            pytest.fail(f"a valid request was refused: {exc}\nkwargs={kwargs!r}")
        if want is not None:
            assert "non-finite" in str(exc), str(exc)
            figures.add(section, "refused_non_finite_outputs")
    except Exception as exc:  # noqa: BLE001 - anything but InputError is the failure this test looks for
        figures.add(section, "other_exceptions")
        pytest.fail(f"{type(exc).__name__} (not InputError): {exc}\nkwargs={kwargs!r}")
    else:
        figures.add(section, "accepted")
        if not finite(got):
            figures.add(section, "nans_returned")
            pytest.fail(f"non-finite outputs returned for kwargs={kwargs!r}")
        assert want is not None, f"an invalid request was accepted: kwargs={kwargs!r}"
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == np.float32
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    still_healthy(rt)


@settings(max_examples=scaled(500))
@given(data=st.data())
def test_run_token_model(tokens_rt, figures, data):
    check_run(tokens_rt, data.draw(run_kwargs(tokens_rt)), figures, "input_fuzz")


@settings(max_examples=scaled(500))
@given(data=st.data())
def test_run_feature_model(features_rt, figures, data):
    check_run(features_rt, data.draw(run_kwargs(features_rt)), figures, "input_fuzz")


@st.composite
def embed_args(draw, rt):
    rank = 1 if rt.config.takes_ids else 2
    kind = draw(st.sampled_from(["list"] * 5 + ["tuple", "generator", "ndarray", "odd", "odd"]))
    if kind == "odd":  # not a list of sequences at all
        items, sequences = None, draw(st.sampled_from([None, 5, 2.5, object(), np.int64(3), True, "abc", b"xy",
                                                       {"a": 1}, {1, 2}, ODD_VALUES[-1], [[[1]]]]))
    elif kind == "ndarray":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        shape = (draw(st.integers(0, 4)), draw(st.integers(1, 6))) + ((rt.config.hidden_size,) if rank == 2 else ())
        items = list(fill(np.dtype(np.int64 if rank == 1 else np.float32), shape, "valid", rt.config, rng))
        sequences = np.array(items).reshape(shape)
    else:
        items = draw(st.lists(st.one_of(valid_array(rt.config, rank), valid_array(rt.config, rank),
                                        array_like(rt.config, rank)), max_size=6))
        sequences = {"list": items, "tuple": tuple(items), "generator": (s for s in items)}[kind]
    batch_size = draw(st.sampled_from([1, 1, 2, 3, 32, 0, -1, True, 2.0, "4", None]))
    output = draw(st.sampled_from([None, None, "last_hidden_state", "sentence_embedding", "pooled", 3]))
    return items, sequences, batch_size, output


def check_embed(rt, items, sequences, batch_size, output, figures, section: str) -> None:
    still_healthy(rt)
    figures.add(section, "inputs_tried")
    name = (contract.SENTENCE_EMBEDDING if rt.pools else contract.LAST_HIDDEN_STATE) if output is None else output
    valid = (isinstance(name, str) and name in rt.output_names and isinstance(batch_size, int)
             and not isinstance(batch_size, bool) and batch_size >= 1 and items is not None)
    singles = []
    for item in items if valid else []:
        array = to_array(item)
        feeds = oracle(rt, {rt.main_input: array[None]}) if array is not None and array.ndim == (1 if rt.config.takes_ids else 2) else None
        if feeds is None:
            valid = False
            break
        singles.append(direct(rt, feeds)[name][0])
    try:
        got = rt.embed(sequences, batch_size=batch_size, output=output)
    except InputError as exc:
        figures.add(section, "input_errors")
        if valid and all(np.isfinite(s).all() for s in singles):
            pytest.fail(f"a valid embed request was refused: {exc}\nitems={items!r}")
    except Exception as exc:  # noqa: BLE001
        figures.add(section, "other_exceptions")
        pytest.fail(f"{type(exc).__name__} (not InputError): {exc}\nsequences={sequences!r}")
    else:
        figures.add(section, "accepted")
        rows = list(got)
        if not all(np.isfinite(r).all() for r in rows):
            figures.add(section, "nans_returned")
            pytest.fail(f"non-finite outputs returned for items={items!r}")
        assert valid, f"an invalid embed request was accepted: {sequences!r} batch_size={batch_size!r} output={output!r}"
        assert len(rows) == len(singles)
        if name == contract.SENTENCE_EMBEDDING:
            assert isinstance(got, np.ndarray) and got.shape == (len(singles), rt.config.hidden_size)
        for row, single in zip(rows, singles):
            assert row.shape == single.shape and row.dtype == np.float32
            if batch_size == 1:  # no padding: the very same call
                np.testing.assert_array_equal(row, single)
            else:  # padded batches run other GEMM shapes: equal to float32 rounding
                np.testing.assert_allclose(row, single, rtol=0, atol=1e-5)
    still_healthy(rt)


@settings(max_examples=scaled(300))
@given(data=st.data())
def test_embed_token_model(tokens_rt, figures, data):
    check_embed(tokens_rt, *data.draw(embed_args(tokens_rt)), figures, "input_fuzz")


@settings(max_examples=scaled(300))
@given(data=st.data())
def test_embed_feature_model(features_rt, figures, data):
    check_embed(features_rt, *data.draw(embed_args(features_rt)), figures, "input_fuzz")


@pytest.mark.parametrize("scale", [1e20, 1e30, 1e37, 3e38])
def test_finite_but_huge_features_never_come_back_as_nan(features_rt, figures, scale):
    """float32-finite inputs near the top of the range overflow inside LayerNorm/attention;
    before the runtime checked its outputs these came back as NaN without an error."""
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(20):
        x = np.clip(rng.standard_normal((2, 5, features_rt.config.hidden_size)) * scale, -3.4e38, 3.4e38).astype(np.float32)
        want = direct(features_rt, oracle(features_rt, {"inputs_embeds": x}))
        figures.add("input_fuzz", "inputs_tried")
        try:
            got = features_rt.run(inputs_embeds=x)
        except InputError as exc:
            assert "non-finite" in str(exc) and not finite(want)
            refused += 1
            figures.add("input_fuzz", "refused_non_finite_outputs")
            continue
        assert finite(got) and finite(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    if scale >= 1e38:
        assert refused, "expected some inputs this large to overflow (the check above would be vacuous)"
    still_healthy(features_rt)
