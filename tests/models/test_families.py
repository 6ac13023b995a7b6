"""The family registry (models/hf/family.py): every model_type has a record with a loader, the
tables derived from it agree, and the export --from help lists every model_type."""
import importlib

import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from ortformer.core.errors import CheckpointError
from ortformer.models.hf import family


def test_every_module_declares_one_record_with_a_loader():
    for name in family.FAMILY_MODULES:
        record = importlib.import_module(f"ortformer.models.hf.families.{name}").FAMILY
        assert isinstance(record, family.Family), name
        assert record.name and record.model_types, name
        assert callable(record.load), name
        assert record.load.__module__ == f"ortformer.models.hf.families.{name}", f"{name} declares another module's loader"


def test_each_model_type_has_one_main_family_and_variants_extend_one():
    main = [t for r in family.families() if r.detect is None for t in r.model_types]
    assert len(main) == len(set(main)) == len(family.model_types())
    for record in family.families():
        if record.detect is not None:  # a variant keeps a main family's model_type
            assert set(record.model_types) <= set(main), record.name


def test_a_model_type_claimed_twice_is_refused(monkeypatch):
    monkeypatch.setattr(family, "FAMILY_MODULES", ("roberta", "roberta"))
    with pytest.raises(RuntimeError, match="claimed by more than one"):
        family.families.__wrapped__()


def test_family_for_routes_variants_by_detect():
    assert family.family_for({"model_type": "bert"}).name == "BERT"
    assert family.family_for({"model_type": "bert", "position_embedding_type": "alibi"}).name == "JinaBERT v2"
    assert family.family_for({"model_type": "xlm-roberta"}).name == "RoBERTa"
    assert family.family_for({"model_type": "gemma3"}) is None


def test_the_unsupported_error_lists_every_model_type_and_the_hint():
    from ortformer.models.loading import unsupported_model_type

    message = str(unsupported_model_type("gemma3"))
    listed = message.split("ortformer imports ", 1)[1].split(";")[0].split(", ")
    assert listed == sorted(family.model_types())
    assert "gemma3_text" in message.split(";", 2)[-1]  # the hint: where a Gemma 3 encoder is imported from
    assert isinstance(unsupported_model_type("nope"), CheckpointError)


def test_the_export_help_lists_every_model_type():
    help_text = CliRunner().invoke(cli, ["export", "--help"], terminal_width=10_000).output
    line = next(line for line in help_text.splitlines() if line.lstrip().startswith("--from"))
    listed = line.split("model_type: ", 1)[1].rstrip(").").split(", ")
    assert listed == list(family.model_types())


def test_vocab_tokenizers_name_only_their_own_model_types():
    for record in family.families():
        assert set(record.vocab_tokenizers) <= set(record.model_types), record.name
        for spec in record.vocab_tokenizers.values():
            assert callable(spec.build) and spec.files, record.name
