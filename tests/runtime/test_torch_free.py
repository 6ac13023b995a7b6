"""ortformer.runtime must work in a process where torch cannot be imported at all."""
import subprocess
import sys

from support.torch_free import REPO, run_python


def test_import_alone_does_not_load_torch():
    """Nor huggingface_hub, which only a model fetched by its hub id needs (models/hub.py)."""
    code = ("import sys, ortformer.runtime, ortformer.cli\n"
            "assert 'torch' not in sys.modules, 'torch'\nassert 'huggingface_hub' not in sys.modules, 'huggingface_hub'")
    done = subprocess.run([sys.executable, "-c", code],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr


def test_import_defers_onnx_to_the_first_model():
    """onnx (a third of the import time) loads when a file is read, not at import."""
    code = "import sys; from ortformer.runtime import Runtime, read_model_file; print('onnx' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_load_and_run_without_torch(tokens_model, tokens_rt):
    code = f"""
import sys
from ortformer.runtime import Runtime
rt = Runtime({str(tokens_model)!r}, "cpu")
out = rt.run(input_ids=[[1, 2, 3]])
print(repr(out["sentence_embedding"][0, :4].tolist()))
print(len(rt.embed([[1], [2, 3]])))
assert 'torch' not in sys.modules
"""
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    want = tokens_rt.run(input_ids=[[1, 2, 3]])["sentence_embedding"][0, :4].tolist()
    assert eval(first) == want and second == "2"
