"""An export killed at any step leaves the previous model byte-identical (or, past
the commit point, the complete new one): never a partial file."""
import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import onnx
import pytest

from ortformer import contract
from ortformer.config import preset
from ortformer.exporter import export
from ortformer.exporter.atomic import stage_model
from ortformer.core.errors import ExportError
from ortformer.modelfile import file_weights_digest
from ortformer.runtime import read_model_file

CHILD_CONFIG = dict(attention="cosine")
CHILD = textwrap.dedent("""
    import sys
    from ortformer.config import preset
    from ortformer.exporter import export
    if len(sys.argv) > 2:  # the trace of this very model, made once by the test: later steps are under test
        import importlib, onnx
        export_module = importlib.import_module("ortformer.exporter.export")  # the module, not the function
        trace = onnx.load(sys.argv[2])
        export_module._trace_to_onnx = lambda model, opset, fused_ops=True, padding="any": trace
    export(preset("tiny", **%r), sys.argv[1], force=True, seed=9,
           progress=lambda step: print("STEP", step, flush=True))
""" % CHILD_CONFIG)


@pytest.fixture(scope="module")
def old_model(tokens_model):
    """The bytes of a complete tiny model (the session's: tiny, seed 0, parity off)."""
    return tokens_model.read_bytes()


@pytest.fixture(scope="module")
def child_trace(tmp_path_factory):
    """The child's model traced once, so that a kill after tracing does not trace it again."""
    export_module = importlib.import_module("ortformer.exporter.export")  # the module, not the function
    traces = []
    real = export_module._trace_to_onnx

    def keep(model, opset, fused_ops=True, padding="any"):
        traces.append(real(model, opset, fused_ops, padding))
        return traces[-1]

    path = tmp_path_factory.mktemp("trace") / "trace.onnx"
    export_module._trace_to_onnx = keep
    try:
        export(preset("tiny", **CHILD_CONFIG), path.with_name("m.onnx"), seed=9, parity=False)
    finally:
        export_module._trace_to_onnx = real
    onnx.save(traces[0], str(path))
    return path


@pytest.mark.parametrize("step, delay", [
    ("tracing", 0.5), ("writing", 0.0), ("onnx.checker", 0.05), ("parity gate", 0.2),
])
def test_sigkill_mid_export_keeps_the_old_model(step, delay, old_model, tmp_path, request):
    path = tmp_path / "m.onnx"
    path.write_bytes(old_model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    trace = [] if step == "tracing" else [str(request.getfixturevalue("child_trace"))]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), *trace], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        for line in child.stdout:
            if line.startswith("STEP") and step in line:
                time.sleep(delay)
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    data = path.read_bytes()
    if data != old_model:  # only legal if the commit point was passed: a complete new model
        model_file = read_model_file(path)
        assert model_file.config.attention == "cosine" and model_file.parity["passed"]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".onnx"] == ["m.onnx"]


def test_staging_happens_beside_the_destination_and_commit_replaces(tmp_path, old_model):
    path = tmp_path / "m.onnx"
    path.write_bytes(old_model)
    staged = stage_model(onnx.load_from_string(old_model), path, force=True)
    assert staged.path.parent.parent == tmp_path and path.read_bytes() == old_model
    with pytest.raises(ExportError, match="already exists"):
        staged.commit(force=False)
    assert path.read_bytes() == old_model
    staged.commit(force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.usefixtures("cached_tracing")  # staging is under test, not tracing
def test_external_data_pair_is_committed_data_first(tmp_path, monkeypatch, old_model):
    """Models past the inline limit go to a uniquely named side file; the old pair
    stays valid until the ONNX file is replaced, and its data file is removed after."""
    import ortformer.exporter.atomic as atomic

    monkeypatch.setattr(atomic, "INLINE_LIMIT_BYTES", 1000)
    path = tmp_path / "m.onnx"
    first = export(preset("tiny"), path, parity=False).files
    assert len(first) == 2 and first[1].name.startswith("m.onnx.") and first[1].suffix == ".data"
    second = export(preset("tiny"), path, parity=False, force=True, seed=1).files
    assert second[1] != first[1] and not first[1].exists() and second[1].exists()
    assert read_model_file(path).external_files == (second[1].resolve(),)
    # the digest reads the side file's bytes: the same weights inline give the same digest
    monkeypatch.setattr(atomic, "INLINE_LIMIT_BYTES", 1 << 40)
    inline = export(preset("tiny"), tmp_path / "inline.onnx", parity=False, seed=1).files
    assert len(inline) == 1
    digests = [read_model_file(p).metadata[contract.META_WEIGHTS] for p in (path, inline[0])]
    assert digests[0] == digests[1] == file_weights_digest(path)
    data = bytearray(second[1].read_bytes())
    data[len(data) // 2] ^= 0x01
    second[1].write_bytes(bytes(data))
    assert file_weights_digest(path) != digests[0]
