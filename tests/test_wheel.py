"""The wheel holds every file of ortformer/ the code reads at run time, and the CI smoke
(.ci/wheel_smoke.py, run by .ci/run after the suite) resolves each extra's requirements from
the wheel's own metadata. The smoke itself (fresh venvs, export, infer, serve) runs in CI."""
import importlib.util
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("wheel_smoke", ROOT / ".ci" / "wheel_smoke.py")
wheel_smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheel_smoke)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return wheel_smoke.build(tmp_path_factory.mktemp("dist"))


def test_the_wheel_holds_every_tracked_file_of_the_package(built):
    _, wheel = built
    assert wheel.name.startswith("ortformer-") and wheel.suffix == ".whl"
    assert wheel_smoke.missing_from_wheel(wheel) == []
    names = zipfile.ZipFile(wheel).namelist()
    # only the package: no tests, no benchmarks (the peer harness is dev-only)
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks")]


def test_a_file_left_out_of_the_wheel_is_named(built, tmp_path):
    _, wheel = built
    cut = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(cut, "w") as target:
        for item in source.infolist():
            if item.filename != "ortformer/serve/routes.py":
                target.writestr(item, source.read(item))
    assert wheel_smoke.missing_from_wheel(cut) == ["ortformer/serve/routes.py"]


def test_each_extra_resolves_from_the_wheels_metadata(built):
    _, wheel = built
    base = wheel_smoke.closure(wheel_smoke.wheel_requirements(wheel, ("",)))
    served = wheel_smoke.closure(wheel_smoke.wheel_requirements(wheel, ("", "serve")))
    assert {"numpy", "onnx", "click"} <= set(base) and not {"torch", "tokenizers", "starlette"} & set(base)
    # serve pulls ortformer[text] in: the self-reference is expanded, not looked up
    assert {"tokenizers", "starlette", "uvicorn"} <= set(served) and not {"torch", "ortformer"} & set(served)


def test_the_link_view_holds_the_distributions_and_their_metadata(built, tmp_path):
    _, wheel = built
    view = wheel_smoke.link_view(wheel_smoke.closure(wheel_smoke.wheel_requirements(wheel, ("",))), tmp_path / "v")
    names = {p.name for p in view.iterdir()}
    assert {"numpy", "onnx", "click"} <= names and any(n.startswith("numpy-") and n.endswith(".dist-info") for n in names)
    assert "torch" not in names
