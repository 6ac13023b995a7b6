"""Hostile model files: each is opened with Runtime(path, "cpu") in a child process,
so a segfault or abort shows up as a crash (negative return code) instead of
killing the test run.

Guarantees checked:
- every truncated, random, foreign, mis-described or escaping file is refused with
  ModelFileError, before onnxruntime is asked to open anything (the child wraps
  onnxruntime.InferenceSession and reports whether it was called);
- nothing outside the model's folder is read: the child's audit hook sees every
  Python-level open, and sentinel files outside the folder keep their atime;
- byte-mutated copies of a good model never crash the process: they are refused
  (ModelFileError) or load and then answer with finite outputs or a typed error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from support.reliability import child_env, scaled

from ortformer import contract
from ortformer.config import CONFIG_FORMAT

RUNNER = textwrap.dedent("""
    import json, os, sys
    cases = json.load(open(sys.argv[1]))
    watching, opened_paths = [False], []

    def audit(event, args):
        if watching[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            opened_paths.append(os.path.abspath(os.fsdecode(args[0])))

    sys.addaudithook(audit)
    import numpy as np
    import onnxruntime as ort
    from ortformer.runtime import Runtime

    real_session, sessions = ort.InferenceSession, []

    def spy(*args, **kwargs):
        sessions.append(str(args[0]))
        return real_session(*args, **kwargs)

    ort.InferenceSession = spy
    for case in cases:
        print("START", case["name"], flush=True)
        del sessions[:], opened_paths[:]
        result = {"name": case["name"], "error": None, "message": "", "ran": None}
        watching[0] = True
        try:
            rt = Runtime(case["path"], "cpu")
        except Exception as exc:
            result["error"], result["message"] = type(exc).__name__, str(exc)[:400]
        else:
            cfg = rt.config
            shape = (2, min(5, cfg.max_positions))
            main = np.ones(shape, np.int64) if cfg.takes_ids else np.ones(shape + (cfg.hidden_size,), np.float32)
            try:
                out = rt.run(**{rt.main_input: main})
                result["ran"] = "finite" if all(np.isfinite(v).all() for v in out.values()) else "NON-FINITE"
            except Exception as exc:
                result["ran"], result["ran_module"] = type(exc).__name__, type(exc).__module__
                result["message"] = str(exc)[:400]
        watching[0] = False
        result["ort_opened"] = bool(sessions)
        result["opened"] = sorted(set(os.path.realpath(p) for p in opened_paths))
        print("RESULT", json.dumps(result), flush=True)
""")


def run_cases(cases: list[dict], workdir: Path, figures, group: str) -> dict[str, dict]:
    """Run (name, path) cases through RUNNER; a crash is recorded and the rest rerun."""
    results: dict[str, dict] = {}
    pending = list(cases)
    while pending:
        spec = workdir / f"cases-{len(results)}.json"
        spec.write_text(json.dumps([{"name": c["name"], "path": str(c["path"])} for c in pending]))
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(spec)], check=False, capture_output=True, text=True,
                              env=child_env(), timeout=300, cwd=workdir)
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line[6:]
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
                results[result["name"]] = result
                started = None
        names = [c["name"] for c in pending]
        if started is None and proc.returncode == 0 and all(n in results for n in names):
            break
        culprit = started if started is not None else next(n for n in names if n not in results)
        results[culprit] = {"name": culprit, "error": f"CRASH returncode={proc.returncode}",
                            "message": proc.stderr[-2000:], "crash": True, "ort_opened": None, "opened": []}
        pending = [c for c in pending if c["name"] not in results]
    figures.add("hostile_models", "files_tried", len(cases))
    figures.add("hostile_models", f"files_{group}", len(cases))
    figures.add("hostile_models", "crashes", sum(1 for r in results.values() if r.get("crash")))
    figures.add("hostile_models", "model_file_errors", sum(1 for r in results.values() if r["error"] == "ModelFileError"))
    return results


def assert_refused_before_onnxruntime(results: dict[str, dict], folder_of: dict[str, Path] | None = None) -> None:
    problems = []
    for name, r in results.items():
        if r["error"] != "ModelFileError":
            problems.append(f"{name}: {r['error'] or 'LOADED'} {r.get('ran') or ''} {r['message'][:300]}")
        elif r["ort_opened"]:
            problems.append(f"{name}: refused only after onnxruntime opened the file: {r['message'][:200]}")
        if folder_of and name in folder_of:  # nothing outside the model's folder was opened by Python
            outside = [p for p in r["opened"] if not Path(p).is_relative_to(folder_of[name].resolve())
                       and not p.endswith((".py", ".pyc", ".so")) and not p.startswith((sys.prefix, sys.base_prefix))]
            if outside:
                problems.append(f"{name}: opened files outside the model's folder: {outside}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- building files

def top_level_boundaries(data: bytes) -> list[int]:
    """Byte offsets where a top-level protobuf field of the ModelProto ends: the only cut
    points at which a truncated file still parses."""
    position, ends = 0, []

    def varint(at: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            byte = data[at]
            value |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if byte < 0x80:
                return value, at

    while position < len(data):
        key, position = varint(position)
        wire = key & 7
        if wire == 0:
            _, position = varint(position)
        elif wire == 1:
            position += 8
        elif wire == 2:
            length, position = varint(position)
            position += length
        elif wire == 5:
            position += 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        ends.append(position)
    return ends


def set_meta(model: onnx.ModelProto, **changes) -> onnx.ModelProto:
    props = {p.key: p.value for p in model.metadata_props}
    props.update({k.replace("__", "."): v for k, v in changes.items()})
    del model.metadata_props[:]
    for key, value in props.items():
        if value is not None:
            model.metadata_props.add(key=key, value=value)
    return model


def with_config(model: onnx.ModelProto, **fields) -> onnx.ModelProto:
    meta = {p.key: p.value for p in model.metadata_props}
    config = {**json.loads(meta[contract.META_CONFIG]), **fields}
    return set_meta(model, ortformer__config=json.dumps(config))


def make_external(model: onnx.ModelProto, folder: Path, location: str, *, write_to: Path | None = None,
                  offset: int | str = 0, length: int | str | None = None, dims=None, extra=()) -> Path:
    """Move the largest initializer's bytes to an external file; returns folder/model.onnx."""
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    data = tensor.raw_data
    if write_to is not None:
        write_to.parent.mkdir(parents=True, exist_ok=True)
        write_to.write_bytes(data)
    del tensor.external_data[:]
    entries = [("location", location), ("offset", str(offset))]
    entries.append(("length", str(len(data) if length is None else length))) if length != "absent" else None
    for key, value in [*entries, *extra]:
        tensor.external_data.add(key=key, value=value)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    if dims is not None:
        del tensor.dims[:]
        tensor.dims.extend(dims)
    path = folder / "model.onnx"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def old_atime(path: Path) -> float:
    """Set atime well before mtime, so that any read updates it even under relatime."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_mtime_ns - 10**12, stat.st_mtime_ns))
    return path.stat().st_atime_ns


@pytest.fixture(scope="module")
def good(tokens_model) -> bytes:
    return tokens_model.read_bytes()


@pytest.fixture(scope="module")
def atime_works(tmp_path_factory) -> bool:
    probe = tmp_path_factory.mktemp("atime") / "probe"
    probe.write_bytes(b"x" * 100)
    before = old_atime(probe)
    probe.read_bytes()
    return probe.stat().st_atime_ns != before


# ---------------------------------------------------------------- the cases

def test_truncated_at_every_field_boundary_and_many_cut_points(tmp_path, good, figures):
    boundaries = top_level_boundaries(good)
    assert boundaries[-1] == len(good) and len(boundaries) >= 8
    rng = np.random.default_rng(7)
    cuts = set(boundaries[:-1]) | {0, 1, 2, 7, 8, len(good) - 1}
    cuts |= {b + d for b in boundaries[:-1] for d in (-1, 1) if 0 < b + d < len(good)}
    cuts |= set(rng.integers(1, len(good), size=scaled(120)).tolist())
    cuts |= set(np.linspace(1, len(good) - 1, 40).astype(int).tolist())
    cases = []
    for cut in sorted(cuts):
        path = tmp_path / f"cut{cut}" / "model.onnx"
        path.parent.mkdir()
        path.write_bytes(good[:cut])
        cases.append({"name": f"cut{cut}", "path": path})
    control = tmp_path / "whole" / "model.onnx"
    control.parent.mkdir()
    control.write_bytes(good)
    results = run_cases(cases + [{"name": "whole", "path": control}], tmp_path, figures, "truncated")
    whole = results.pop("whole")
    assert whole["error"] is None and whole["ran"] == "finite", whole  # the harness can tell a good file
    figures.add("hostile_models", "truncation_cut_points", len(cases))
    assert_refused_before_onnxruntime(results)


def test_random_bytes(tmp_path, good, figures):
    rng = np.random.default_rng(11)
    cases = []
    for i in range(scaled(40)):
        size = int(rng.choice([0, 1, 8, 100, 4096, 50_000]))
        data = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        if i % 4 == 1:  # a valid protobuf start, then noise
            data = good[: int(rng.integers(1, 200))] + data
        if i % 4 == 2:  # protobuf-shaped noise: field tags with huge lengths
            data = b"\x3a\xff\xff\xff\xff\x0f" + data
        path = tmp_path / f"random{i}.onnx"
        path.write_bytes(data)
        cases.append({"name": f"random{i}", "path": path})
    for name, data in {"png": b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "zip": b"PK\x03\x04" + b"\0" * 64,
                       "json": b'{"ortformer.format": "1"}', "pickle": b"\x80\x04\x95" + b"\0" * 32}.items():
        (tmp_path / f"{name}.onnx").write_bytes(data)
        cases.append({"name": name, "path": tmp_path / f"{name}.onnx"})
    assert_refused_before_onnxruntime(run_cases(cases, tmp_path, figures, "random_bytes"))


def test_foreign_future_and_misdescribed_models(tmp_path, tokens_model, figures):
    def save(name: str, model: onnx.ModelProto) -> dict:
        path = tmp_path / name / "model.onnx"
        path.parent.mkdir()
        onnx.save_model(model, str(path))
        return {"name": name, "path": path}

    fresh = lambda: onnx.load(str(tokens_model))
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    identity = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                                 ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    stolen = fresh()
    foreign_with_meta = helper.make_model(identity.graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    foreign_with_meta.metadata_props.extend(stolen.metadata_props)
    no_meta = fresh()
    del no_meta.metadata_props[:]
    cases = [
        save("foreign_identity", identity),
        save("foreign_graph_with_ortformer_metadata", foreign_with_meta),
        save("ortformer_graph_without_metadata", no_meta),
        save("future_format", set_meta(fresh(), ortformer__format="2")),
        save("empty_format", set_meta(fresh(), ortformer__format="")),
        save("future_config_format", with_config(fresh(), format=CONFIG_FORMAT + 1)),
        save("config_not_json", set_meta(fresh(), ortformer__config="{")),
        save("config_nested_deep", set_meta(fresh(), ortformer__config="[" * 100_000)),
        save("parity_nested_deep", set_meta(fresh(), ortformer__parity="[" * 100_000)),
        save("config_unknown_key", with_config(fresh(), wings=2)),
        save("config_group_unknown_key", with_config(fresh(), classifier={"labels": 2, "wings": 2})),
        save("config_group_not_an_object", with_config(fresh(), local_attention=8)),
        save("config_invalid_value", with_config(fresh(), hidden_size=-4)),
        save("config_wrong_hidden_size", with_config(fresh(), hidden_size=64, ffn_size=128)),
        save("config_wrong_vocab_size", with_config(fresh(), vocab_size=1000)),
        save("config_wrong_type_vocab_size", with_config(fresh(), type_vocab_size=5)),
        save("config_overstates_max_positions", with_config(fresh(), max_positions=128)),
        save("config_wrong_pooling", with_config(fresh(), pooling="none")),
        save("config_says_features", with_config(fresh(), vocab_size=0, type_vocab_size=0)),
        save("parity_not_object", set_meta(fresh(), ortformer__parity="[1]")),
        save("missing_source", set_meta(fresh(), ortformer__source=None)),
    ]
    for name, needle in (("invalid_utf8_input_name", b"attention_mask"), ("invalid_utf8_metadata_key", b"ortformer.source"),
                         ("invalid_utf8_op_type", b"LayerNormalization")):
        data = tokens_model.read_bytes()
        assert needle in data
        path = tmp_path / name / "model.onnx"
        path.parent.mkdir()
        path.write_bytes(data.replace(needle, needle[:-1] + b"\xff"))  # same length: the protobuf stays intact
        cases.append({"name": name, "path": path})
    huge = fresh()
    tensor = max(huge.graph.initializer, key=lambda t: len(t.raw_data))
    del tensor.dims[:]
    tensor.dims.extend([2**21, 2**21, 2**21])  # 2^63 elements declared, 12.8 kB held
    cases.append(save("inline_dims_product_enormous", huge))
    negative = fresh()
    tensor = max(negative.graph.initializer, key=lambda t: len(t.raw_data))
    del tensor.dims[:]
    tensor.dims.extend([-1, 3200])
    cases.append(save("negative_dims", negative))
    assert_refused_before_onnxruntime(run_cases(cases, tmp_path, figures, "foreign_or_misdescribed"))


def test_external_data_and_tokenizer_cannot_leave_the_folder(tmp_path, tokens_model, figures, atime_works):
    fresh = lambda: onnx.load(str(tokens_model))
    weights = max(fresh().graph.initializer, key=lambda t: len(t.raw_data)).raw_data
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.bin"  # what a hostile model would like to read as weights
    secret.write_bytes(weights)
    tokenizer = outside / "tok.json"
    tokenizer.write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}')
    cases, folders = [], {}

    def case(name: str, build) -> None:
        folder = tmp_path / name
        folder.mkdir()
        path = build(folder)
        cases.append({"name": name, "path": path})
        folders[name] = folder

    def tokenizer_case(name: str, location: str, prepare=None) -> None:
        def build(folder: Path) -> Path:
            if prepare:
                prepare(folder)
            path = folder / "model.onnx"
            onnx.save_model(set_meta(fresh(), ortformer__tokenizer=location), str(path))
            return path
        case(name, build)

    case("absolute", lambda f: make_external(fresh(), f, str(secret)))
    case("dotdot", lambda f: make_external(fresh(), f, "../outside/secret.bin"))
    case("dotdot_inside_then_out", lambda f: make_external(fresh(), f, "sub/../../outside/secret.bin"))
    case("windows_absolute", lambda f: make_external(fresh(), f, "C:\\outside\\secret.bin"))
    case("unc_path", lambda f: make_external(fresh(), f, "\\\\server\\share\\secret.bin"))
    case("symlink_out", lambda f: (os.symlink(secret, f / "w.bin"), make_external(fresh(), f, "w.bin"))[1])
    case("symlinked_folder_out", lambda f: (os.symlink(outside, f / "sub"), make_external(fresh(), f, "sub/secret.bin"))[1])
    case("hardlink_out", lambda f: (os.link(secret, f / "w.bin"), make_external(fresh(), f, "w.bin"))[1])
    case("nul_byte", lambda f: make_external(fresh(), f, "w.bin\x00../../outside/secret.bin", write_to=f / "w.bin"))
    case("name_too_long", lambda f: make_external(fresh(), f, "w" * 4000 + ".bin", write_to=f / "w.bin"))
    case("a_folder", lambda f: ((f / "w.bin").mkdir(), make_external(fresh(), f, "w.bin"))[1])
    case("a_fifo", lambda f: (os.mkfifo(f / "w.bin"), make_external(fresh(), f, "w.bin"))[1])
    case("missing", lambda f: make_external(fresh(), f, "nowhere.bin"))
    case("length_past_end", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin", length=10**12))
    case("offset_past_end", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin", offset=10**6))
    case("dims_enormous_no_length", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin",
                                                            length="absent", dims=[2**30, 2**30]))
    case("dims_enormous_with_length", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin",
                                                              dims=[2**30, 2**30]))
    case("offset_not_decimal", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin", offset="1_0"))
    case("length_negative", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin", length=-5))
    case("duplicate_location", lambda f: make_external(fresh(), f, "w.bin", write_to=f / "w.bin",
                                                       extra=[("location", str(secret))]))
    case("ort_memory_marker", lambda f: (f.joinpath("*", "_ORT_MEM_ADDR_").mkdir(parents=True),
                                         make_external(fresh(), f, "*/_ORT_MEM_ADDR_/*", write_to=f / "*/_ORT_MEM_ADDR_/*"))[1])
    tokenizer_case("tokenizer_dotdot", "../outside/tok.json")
    tokenizer_case("tokenizer_absolute", str(tokenizer))
    tokenizer_case("tokenizer_etc_passwd", "/etc/passwd")
    # a tokenizer file that resolves outside (a symlink) or is no file takes text away, not the model: checked below
    linked_tokenizer = outside / "tok-linked.json"  # not the atime sentinel: a hard link's bytes are read
    linked_tokenizer.write_bytes(tokenizer.read_bytes())
    tokenizer_case("tokenizer_symlink_out", "tok.json", lambda f: os.symlink(tokenizer, f / "tok.json"))
    tokenizer_case("tokenizer_hardlink_out", "tok.json", lambda f: os.link(linked_tokenizer, f / "tok.json"))
    tokenizer_case("tokenizer_nul", "tok.json\x00x")
    tokenizer_case("tokenizer_windows", "C:\\outside\\tok.json")
    tokenizer_case("tokenizer_fifo", "tok.json", lambda f: os.mkfifo(f / "tok.json"))

    def hardlink_inside(folder: Path) -> Path:  # two names, both inside: refused by the same one-link rule
        path = make_external(fresh(), folder, "w.bin", write_to=folder / "w.bin")
        os.link(folder / "w.bin", folder / "w-copy.bin")
        return path
    case("hardlink_inside", hardlink_inside)

    control = tmp_path / "control"
    control.mkdir()
    good_external = make_external(fresh(), control, "w.bin", write_to=control / "w.bin")
    before = {p: old_atime(p) for p in (secret, tokenizer)}
    results = run_cases(cases + [{"name": "control", "path": good_external}], tmp_path, figures, "escaping_or_oversized")
    control_result = results.pop("control")
    assert control_result["error"] is None and control_result["ran"] == "finite", control_result
    # the model serves ids; a symlinked tokenizer outside is never read, a hard-linked one is (its bytes
    # are parsed as a tokenizer only, never routed to the outputs as weights can be)
    symlinked, hard_linked = results.pop("tokenizer_symlink_out"), results.pop("tokenizer_hardlink_out")
    fifo = results.pop("tokenizer_fifo")  # never opened (a FIFO would block the reader): text is unavailable
    for r in (symlinked, hard_linked, fifo):
        assert r["error"] is None and r["ran"] == "finite", r
    assert str(tokenizer) not in symlinked["opened"]
    from ortformer.runtime import Runtime
    from ortformer.runtime.session import TextUnavailableWarning

    with pytest.warns(TextUnavailableWarning, match="outside the model's folder"):
        assert "outside the model's folder" in Runtime(folders["tokenizer_symlink_out"] / "model.onnx").text_problem
    assert Runtime(folders["tokenizer_hardlink_out"] / "model.onnx").text_problem is None
    assert str((control / "w.bin").resolve()) not in control_result["opened"]  # onnxruntime reads it in C++
    assert_refused_before_onnxruntime(results, {n: folders[n] for n in results})
    for name, r in results.items():
        assert str(secret) not in r["opened"] and str(tokenizer) not in r["opened"], name
    if atime_works:
        assert {p: p.stat().st_atime_ns for p in before} == before, "a file outside the model folders was read"
    figures.set("hostile_models", "atime_sentinels_checked", bool(atime_works))
    assert results["hardlink_out"]["message"].count("hard link")


def test_byte_mutations_never_crash(tmp_path, good, figures):
    """Flipped bytes anywhere in a good model: refused, or loaded and then finite or a typed error."""
    rng = np.random.default_rng(3)
    boundaries = top_level_boundaries(good)
    graph_end = boundaries[-1]
    cases = []
    for i in range(scaled(60)):
        data = bytearray(good)
        where = "anywhere" if i % 2 else "structure"  # structure: outside the big weight blobs
        for _ in range(int(rng.integers(1, 6))):
            if where == "structure":
                position = int(rng.choice([rng.integers(0, 64), rng.integers(max(0, graph_end - 3000), graph_end)]))
            else:
                position = int(rng.integers(0, len(data)))
            data[position] = int(rng.integers(0, 256))
        path = tmp_path / f"m{i}" / "model.onnx"
        path.parent.mkdir()
        path.write_bytes(bytes(data))
        cases.append({"name": f"mutation{i}", "path": path})
    results = run_cases(cases, tmp_path, figures, "byte_mutated")
    crashes = [r for r in results.values() if r.get("crash")]
    assert not crashes, crashes[0]
    outcomes: dict[str, int] = {}
    for r in results.values():
        key = r["error"] or f"loaded:{r['ran']}"
        outcomes[key] = outcomes.get(key, 0) + 1
        assert r["error"] in (None, "ModelFileError"), r
        assert r["ran"] != "NON-FINITE", r  # a NaN is never returned, whatever the file
        if r["error"] is None:  # loaded: a finite answer, or a typed error from us or onnxruntime
            assert r["ran"] in ("finite", "InputError") or r.get("ran_module", "").startswith("onnxruntime"), r
    figures.set("hostile_models", "mutation_outcomes", outcomes)


def test_a_cut_never_silently_drops_optional_metadata(tmp_path, tokens_model, monkeypatch):
    """Protobuf has no end marker: a file cut exactly between two top-level fields parses.
    Every such cut must be refused, or keep all the metadata the whole file has."""
    from ortformer.core.errors import ModelFileError
    from ortformer.runtime import read_model_file

    export_module = sys.modules["ortformer.exporter.export"]
    cached = onnx.load(str(tokens_model))
    del cached.metadata_props[:]
    monkeypatch.setattr(export_module, "_trace_to_onnx", lambda *a, **k: onnx.ModelProto.FromString(cached.SerializeToString()))
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}')
    path = tmp_path / "m.onnx"
    export_module.export(read_model_file(tokens_model).config, path, parity=False, tokenizer=tokenizer, text_max_length=32)
    data = path.read_bytes()
    whole = read_model_file(path).metadata
    silently_lost = []
    for cut in top_level_boundaries(data)[:-1]:
        (tmp_path / "cut.onnx").write_bytes(data[:cut])
        try:
            kept = read_model_file(tmp_path / "cut.onnx").metadata
        except ModelFileError:
            continue
        if kept != whole:
            silently_lost.append((cut, sorted(set(whole) - set(kept))))
    assert not silently_lost, f"cuts that load but lost metadata: {silently_lost}"
