"""describe(): the info report as a library call (the CLI only prints it)."""
import pytest

from ortformer.contract.cost import flops_per_sequence, parameter_count
from ortformer.core.errors import InputError, ModelFileError
from ortformer.runtime.describe import describe


def test_describe_reports_the_file_and_its_costs(tokens_model, tokens_rt):
    report = describe(tokens_model, sequence_length=16)
    cfg = tokens_rt.config
    assert report["config"] == cfg.to_dict() and report["source"] == tokens_rt.source
    assert report["files"] == {str(tokens_model.resolve()): tokens_model.stat().st_size}
    assert report["parameters"]["total"] == parameter_count(cfg)
    assert report["flops"] == {"sequence_length": 16, "total": sum(flops_per_sequence(cfg, 16).values()),
                               **flops_per_sequence(cfg, 16)}
    assert [s["name"] for s in report["inputs"]] == tokens_rt.input_names
    assert describe(tokens_model)["flops"]["sequence_length"] == min(128, cfg.max_positions)


def test_describe_refuses_bad_arguments_and_files(tokens_model, tmp_path):
    with pytest.raises(InputError, match="sequence_length=0 must be an int >= 1"):
        describe(tokens_model, sequence_length=0)
    (tmp_path / "junk.onnx").write_bytes(b"junk")
    with pytest.raises(ModelFileError, match="junk.onnx"):
        describe(tmp_path / "junk.onnx")
