"""Run Python code in a child process where torch cannot be imported at all."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A meta-path hook that makes torch (and our torch-side packages) unimportable, as in an
# install without the export extra; indirect imports fail too, even inside try/except.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch' or name.startswith(('ortformer.models', 'ortformer.exporter')):
            raise ImportError('blocked by the torch-free test: ' + name)
sys.meta_path.insert(0, Block())
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
