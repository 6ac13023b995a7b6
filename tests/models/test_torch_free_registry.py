"""The family registry's torch-free parts import where torch cannot be imported at all; the
torch gate sits where torch is needed (the family modules, the torch names of ortformer.models)."""
import subprocess
import sys

import pytest

from support.torch_free import REPO

from ortformer.models.hf.family import FAMILY_MODULES

# torch alone is blocked here (support.torch_free also blocks ortformer.models, which this tests)
BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'torch':
            raise ImportError('blocked by the torch-free test: ' + name)
sys.meta_path.insert(0, Block())
"""


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_family_registry_imports_without_torch():
    done = run_without_torch(
        "import ortformer.models\n"
        "from ortformer.models.hf.family import FAMILY_MODULES, Family, VocabTokenizer, families\n"
        "assert 'bert' in FAMILY_MODULES and Family.__dataclass_fields__['model_types']\n"
        "assert 'torch' not in sys.modules\n"
        "print(len(FAMILY_MODULES))\n")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(FAMILY_MODULES)


def test_torch_parts_fail_with_the_missing_extra_error():
    """Where torch is needed, the error names the extra (as `import ortformer.models` did before)."""
    done = run_without_torch(
        "from ortformer.core.errors import MissingExtraError\n"
        "from ortformer.models.hf import family\n"
        "import ortformer.models as models\n"
        "for use in (lambda: models.build_encoder, lambda: models.load_any, family.families, family.by_model_type):\n"
        "    try:\n"
        "        use()\n"
        "    except MissingExtraError as e:\n"
        "        assert 'torch' in str(e) and 'export' in str(e), str(e)\n"
        "    else:\n"
        "        raise AssertionError('no MissingExtraError')\n"
        "print('ok')\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_model_types_are_listed_without_torch():
    """model_types(), which the export --from help and loading's errors list, where torch cannot be
    imported: the same list, in the same order, as the family modules' records give with torch."""
    from ortformer.models.hf import family

    with_torch = tuple(family.by_model_type())  # the records of the imported family modules
    done = run_without_torch(
        "import ortformer.models as models\n"
        "from ortformer.models.hf.family import model_types\n"
        "assert models.model_types is model_types\n"
        "print(','.join(models.model_types()))\n"
        "from click.testing import CliRunner\n"
        "from ortformer.cli import cli\n"
        "help_text = CliRunner().invoke(cli, ['export', '--help'], terminal_width=10_000).output\n"
        "assert 'model_type: ' + ', '.join(model_types()) + ').' in help_text, help_text\n"
        "assert 'torch' not in sys.modules and not any(m.startswith('ortformer.models.hf.families') for m in sys.modules)\n")
    assert done.returncode == 0, done.stderr
    assert tuple(done.stdout.strip().split(",")) == with_torch == family.model_types()
    assert len(with_torch) > 30 and "bert" in with_torch


def test_a_module_whose_record_differs_from_main_model_types_is_refused(monkeypatch):
    """The torch-free list cannot drift from the modules: families() holds each FAMILY to it."""
    from ortformer.models.hf import family

    monkeypatch.setitem(family.MAIN_MODEL_TYPES, "t5", ("t5",))  # the module imports ("t5", "mt5")
    with pytest.raises(RuntimeError, match=r"family module 't5' imports model_types \['t5', 'mt5'\]"):
        family.families.__wrapped__()
