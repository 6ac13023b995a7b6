"""A bad option value or combination is a usage error (exit 2) that names the option, checked
before an existing output is named; options a command would ignore are refused; the install
line of a missing-extra message works from this repository."""
from pathlib import Path

import pytest
from support.cli import fail, invoke

from ortformer.core.errors import MissingExtraError, install_line


@pytest.fixture
def existing(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"an earlier model")
    return path


@pytest.mark.parametrize("args, words", [
    (["--hidden", "100", "--heads", "3"], "--hidden 100 is not divisible by --heads 3"),
    (["--opset", "17"], "opset 17 is not supported; choose 18.."),
    (["--global-every", "2"], "--global-every shapes local_attention; with --local-window 0 there is none"),
    # --local-window alone says why: the default --global-every 1 would leave no local layer
    (["--local-window", "4"], "--local-window 4 with --global-every 1 makes every layer global: set --global-every >= 2"),
    (["--no-parity", "--keep-failed", "kept.onnx"], "--keep-failed keeps a model that fails the parity gate"),
])
def test_a_bad_value_or_combination_is_a_usage_error_before_the_output_is_named(existing, args, words):
    line = fail("export", "--preset", "tiny", "-o", existing, *args, code=2)
    assert words in line and "already exists" not in line
    assert existing.read_bytes() == b"an earlier model"


def test_a_config_file_keeps_its_own_field_names_and_exit_1(tmp_path):
    config = tmp_path / "c.json"
    config.write_text('{"hidden_size": 100, "num_heads": 3}')
    assert "hidden_size=100 is not divisible by num_heads=3" in fail("export", "--config", config, "-o", tmp_path / "m.onnx")


@pytest.mark.parametrize("args, dropped", [
    (["-o", "x.onnx"], "--output"),
    (["--keep-failed", "k.onnx", "--force"], "--force, --keep-failed"),
    (["--quantize", "int8"], "--quantize"),
])
def test_print_config_refuses_options_it_would_ignore(args, dropped):
    line = fail("export", "--preset", "tiny", "--print-config", *args, code=2)
    assert f"--print-config prints the config and writes no model; drop {dropped}" in line


def test_print_config_alone_prints(tmp_path):
    assert '"hidden_size": 32' in invoke("export", "--preset", "tiny", "--print-config").stdout


def test_export_triton_repo_warns_it_is_deprecated_for_triton_repo(tmp_path):
    result = invoke("export", "--preset", "tiny", "--no-parity", "-o", tmp_path / "m.onnx", "--triton-repo",
                    tmp_path / "models")
    assert f"warning: export --triton-repo is deprecated and will be removed: run `ortformer triton-repo " \
           f"{tmp_path / 'm.onnx'} --repo {tmp_path / 'models'}`" in result.stderr
    assert (tmp_path / "models" / "m" / "config.pbtxt").is_file()  # it still works meanwhile


@pytest.mark.parametrize("args, words", [
    (["--model", "minilm"], "--model 'minilm' must be NAME=PATH"),
    (["{model}", "{model}"], "two models are named 'm'"),
    ([], "no model to serve"),
])
def test_serve_names_are_usage_errors(existing, args, words):
    line = fail("serve", *[a.format(model=existing) for a in args], code=2)
    assert words in line


def test_the_install_line_works_from_this_checkout():
    line = install_line("serve")
    checkout = Path(__file__).resolve().parents[2]
    assert f"pip install -e '{checkout}[serve]'" in line and (checkout / "pyproject.toml").is_file()
    assert "pip install 'ortformer[serve]' once ortformer is on PyPI" in line
    assert install_line("serve") in str(MissingExtraError("ortformer serve", "serve", "starlette"))


def test_the_install_line_outside_a_checkout_is_run_in_a_clone(tmp_path):
    line = install_line("ray", tmp_path / "site-packages" / "ortformer")
    assert line.startswith("pip install '.[ray]' in a clone of the ortformer repository")


def test_readme_installs_from_the_repository():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme[readme.index("## Install"):readme.index("## Command line")]
    assert "pip install '.[serve]'" in block and "pip install 'ortformer[" not in block.split("```")[1]
