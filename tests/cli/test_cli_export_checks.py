"""`export`, `check` and the model-file reader refuse what would fail or mislead later."""
import json
import shutil
import sys
from pathlib import Path

import onnx
import pytest

from ortformer import contract
from ortformer.contract import cost
from ortformer.core.errors import ModelFileError, ParityError
from ortformer.modelfile import file_weights_digest
from ortformer.runtime import Runtime, read_model_file
from support.text_models import minilm_tokenizer  # noqa: E402
from support.cli import fail, invoke  # noqa: E402


def with_metadata(src: Path, dest: Path, key: str, value: str) -> Path:
    model = onnx.load(str(src))
    model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(dest))
    return dest


TINY_TEXT = ["export", "--preset", "tiny", "--vocab", "30522", "--no-parity"]


def test_an_existing_side_file_needs_force(tmp_path):
    mine = tmp_path / "mm2.tokenizer.json"
    mine.write_text("my own notes")
    assert "already exists" in fail(*TINY_TEXT, "--tokenizer", minilm_tokenizer(), "-o", tmp_path / "mm2.onnx")
    assert mine.read_text() == "my own notes" and not (tmp_path / "mm2.onnx").exists()


def test_output_equal_to_an_input_is_refused_even_with_force(tmp_path):
    config = tmp_path / "c.onnx"
    config.write_text('{"num_layers": 1}')
    assert "input" in fail("export", "--config", config, "-o", config, "--force")
    assert config.read_text() == '{"num_layers": 1}'


def test_keep_failed_keeps_a_model_that_loads(tmp_path, monkeypatch):
    from ortformer.contract import parity
    from ortformer.config import preset
    from ortformer.exporter import export

    real = parity.run_parity

    def failing(*args, **kwargs):
        report = real(*args, **kwargs)
        report["cases"][0]["outputs"][contract.SENTENCE_EMBEDDING]["passed"] = False
        return {**report, "passed": False}

    monkeypatch.setattr(parity, "run_parity", failing)
    kept = tmp_path / "mq_failed.onnx"
    with pytest.raises(ParityError):
        export(preset("tiny", vocab_size=30522), tmp_path / "mq.onnx", tokenizer=minilm_tokenizer(), keep_failed=kept)
    assert not (tmp_path / "mq.onnx").exists()
    assert Runtime(kept, "cpu").embed_texts(["kept"]).shape[0] == 1


def test_memory_is_checked_before_allocating(tokens_model, monkeypatch):
    monkeypatch.setattr(cost, "available_memory", lambda: 1 << 30)
    for flag, value in (("--vocab", "1000000000000"), ("--max-positions", "100000000")):
        message = fail("export", "--preset", "tiny", flag, value, "-o", "never.onnx")
        assert "memory" in message and "GiB" in message
    message = fail("export", "--preset", "bert-large", "--layers", 500, "-o", "never.onnx")
    assert "a 500-layer encoder of width 1024" in message and "fewer layers" in message
    message = fail("profile", tokens_model, "--batch", "100000", "--sequence", "64", "--provider", "cpu")
    assert "memory" in message and "GiB" in message


def test_a_foreign_tokenizer_is_refused_at_export(tmp_path):
    too_big = fail("export", "--preset", "tiny", "--no-parity", "--tokenizer", minilm_tokenizer(), "-o", tmp_path / "a.onnx")
    assert "30522" in too_big and "vocab_size" in too_big
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a tokenizer"}')
    assert "tokenizer" in fail(*TINY_TEXT, "--tokenizer", junk, "-o", tmp_path / "b.onnx")
    assert not list(tmp_path.glob("*.onnx"))


def test_check_refuses_a_model_whose_tokenizer_is_not_one(tmp_path):
    model = tmp_path / "t.onnx"
    invoke(*TINY_TEXT, "--tokenizer", minilm_tokenizer(), "-o", model)
    (tmp_path / "t.tokenizer.json").write_text('{"not": "a tokenizer"}')
    assert "tokenizer" in fail("check", model)


@pytest.mark.parametrize("value", ["\u00b2", "-5", "abc", "1.5", "100000", "0", "\u0661"])
def test_a_bad_text_max_length_is_refused_by_the_reader(tokens_model, tmp_path, value):
    path = with_metadata(tokens_model, tmp_path / "m.onnx", contract.META_TEXT_MAX_LENGTH, value)
    with pytest.raises(ModelFileError, match="text_max_length"):
        read_model_file(path)


def test_a_good_text_max_length_is_read(tokens_model, tmp_path):
    path = with_metadata(tokens_model, tmp_path / "m.onnx", contract.META_TEXT_MAX_LENGTH, "8")
    assert Runtime(path, "cpu").text_max_length == 8


def test_config_json_is_documented_strict_and_starts_from_a_preset(tmp_path):
    printed = json.loads(invoke("export", "--preset", "tiny", "--print-config").stdout)
    assert printed["name"] == "tiny" and printed["num_layers"] == 2
    partial = tmp_path / "partial.json"
    partial.write_text('{"num_layers": 1}')
    merged = json.loads(invoke("export", "--preset", "tiny", "--config", partial, "--print-config").stdout)
    assert merged == {**printed, "num_layers": 1}
    dup = tmp_path / "dup.json"
    dup.write_text('{"num_layers": 1, "num_layers": 3}')
    assert "duplicate" in fail("export", "--config", dup, "--print-config")


def test_triton_flags_need_triton_repo_and_an_existing_entry_is_refused_first(tmp_path):
    assert "--triton-repo" in fail("export", "--preset", "tiny", "-o", tmp_path / "a.onnx", "--triton-name", "x", code=2)
    assert "--triton-repo" in fail("export", "--preset", "tiny", "-o", tmp_path / "a.onnx", "--max-batch-size", "8", code=2)
    (tmp_path / "repo" / "a").mkdir(parents=True)
    assert "already exists" in fail("export", "--preset", "tiny", "--no-parity", "-o", tmp_path / "a.onnx",
                                    "--triton-repo", tmp_path / "repo")
    assert not (tmp_path / "a.onnx").exists()


def test_export_summary_and_json_match_info(tmp_path):
    model = tmp_path / "t.onnx"
    out = invoke(*TINY_TEXT, "--tokenizer", minilm_tokenizer(), "-o", model).stdout
    assert "t.tokenizer.json" in out
    exported = json.loads(invoke(*TINY_TEXT, "--tokenizer", minilm_tokenizer(), "-o", model, "--force", "--json").stdout)
    described = json.loads(invoke("info", model, "--json").stdout)
    assert exported["files"] == described["files"]
    assert exported["inputs"] == described["inputs"] and exported["outputs"] == described["outputs"]


def test_check_against_a_copied_folder_compares_the_model_not_its_name(tmp_path):
    transformers = pytest.importorskip("transformers")
    from support.hf import save_hf

    folder = tmp_path / "bert"
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=24)
    save_hf(transformers.BertModel, config, folder)
    model = tmp_path / "b.onnx"
    invoke("export", "--from", folder, "-o", model, "--no-parity")
    copy = tmp_path / "copybert"
    shutil.copytree(folder, copy)
    assert "parity" in invoke("check", model, "--against", copy).stdout
    other = tmp_path / "other"
    save_hf(transformers.BertModel, config, other, seed=1)
    assert "parity" in fail("check", model, "--against", other)


def test_export_from_a_folder_lists_the_tensors_it_drops(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path / "t5"
    config = transformers.T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_decoder_layers=1,
                                   num_heads=4)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(str(folder))
    out = invoke("export", "--from", folder, "-o", tmp_path / "t5.onnx", "--no-parity").stdout
    assert "dropped:" in out and "decoder.* (" in out
    report = json.loads(invoke("export", "--from", folder, "-o", tmp_path / "t5.onnx", "--no-parity", "--force",
                               "--json").stdout)
    assert report["dropped"] and all(n.startswith(("decoder.", "lm_head.")) for n in report["dropped"])


def test_check_against_a_folder_compares_how_texts_are_read(tmp_path):
    """A file must cut, split and prompt texts as the folder it is checked against does;
    a file that takes texts reruns the real-sentence check."""
    from support.hf import save_hf, sentence_folder, transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64)
    folder = save_hf(transformers.BertModel, config, tmp_path / "st")
    sentence_folder(folder, minilm_tokenizer().parent, pooling="mean", normalize=True, max_seq_length=48)
    model = tmp_path / "m.onnx"
    invoke("export", "--from", folder, "-o", model, "--no-parity")
    out = invoke("check", model, "--against", folder).stdout
    assert "PASS" in out and "real text" in out

    def variant(name: str, change) -> Path:
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        change(copy)
        return copy

    def set_json(path: Path, **fields) -> None:
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    shorter = variant("short", lambda d: set_json(d / "sentence_bert_config.json", max_seq_length=32))
    assert "truncates texts at 48 tokens, the source at 32" in fail("check", model, "--against", shorter)
    cased = variant("cased", lambda d: set_json(d / "tokenizer.json", normalizer=None))
    assert "its tokenizer m.tokenizer.json differs from" in fail("check", model, "--against", cased)
    prompted = variant("prompted", lambda d: set_json(d / "config_sentence_transformers.json",
                                                     prompts={"query": "query: "}, default_prompt_name="query"))
    assert "its prompts None differ from the source's" in fail("check", model, "--against", prompted)
    # an ortformer checkpoint holds the tokenizer but no text settings: only the tokenizer is compared
    from ortformer.models import load_any, save_checkpoint

    loaded = load_any(folder)
    save_checkpoint(loaded.model, tmp_path / "ckpt", tokenizer=loaded.tokenizer)
    assert "PASS" in invoke("check", model, "--against", tmp_path / "ckpt").stdout


@pytest.mark.parametrize("damage", ["missing", "not a tokenizer", "leaves the folder"])
def test_a_model_without_a_usable_tokenizer_still_serves_ids(tmp_path, damage):
    """Copying only the .onnx is common: ids keep working, text input says why it cannot."""
    from ortformer.runtime import TextUnavailableWarning

    model = tmp_path / "t.onnx"
    invoke(*TINY_TEXT, "--tokenizer", minilm_tokenizer(), "-o", model)
    side = tmp_path / "t.tokenizer.json"
    if damage == "missing":
        side.unlink()
    elif damage == "not a tokenizer":
        side.write_text('{"not": "a tokenizer"}')
    else:  # a name that leaves the model's folder marks a hostile file: refused whole, never read
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        for name in ("../t.tokenizer.json", "../gone.json", "/etc/passwd"):
            with pytest.raises(ModelFileError, match="only a plain file name"):
                Runtime(with_metadata(model, outside / "t.onnx", contract.META_TOKENIZER, name), "cpu")
        return
    with pytest.warns(TextUnavailableWarning, match="token ids still work"):
        runtime = Runtime(model, "cpu")
    assert runtime.text_problem and runtime.tokenizer_path() is None
    assert runtime.embed([[101, 2023, 102]]).shape == (1, runtime.config.hidden_size)
    with pytest.raises(ModelFileError, match="text input is unavailable"):
        runtime.embed_texts(["a sentence"])
    assert json.loads(invoke("infer", model, "--ids", "[[101, 102]]").stdout)
    assert "text input is unavailable" in fail("infer", model, "--text", "a sentence")
    assert "unavailable (token ids still work)" in invoke("info", model).stdout


def test_export_says_why_an_older_tokenizer_is_not_shipped(tmp_path):
    transformers = pytest.importorskip("transformers")
    from support.hf import save_hf
    folder = tmp_path / "bert"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=24)
    save_hf(transformers.BertModel, config, folder)
    (folder / "spiece.model").write_bytes(b"a sentencepiece model, which ortformer does not convert")
    out = invoke("export", "--from", folder, "-o", tmp_path / "b.onnx", "--no-parity").stdout
    assert "holds spiece.model but no tokenizer.json" in out
    shutil.copy(minilm_tokenizer(), folder / "tokenizer.json")
    summary = json.loads(invoke("export", "--from", folder, "-o", tmp_path / "b.onnx", "--no-parity", "--force",
                                "--json").stdout)
    assert summary["text_note"] is None and "b.tokenizer.json" in " ".join(summary["files"])


def test_int8_is_refused_with_standard_ops_only(tmp_path):
    """int8 writes onnxruntime's MatMulIntegerToFloat: --no-fused-ops (standard ONNX only) cannot hold it."""
    from ortformer.config import preset
    from ortformer.core.errors import ExportError
    from ortformer.exporter import export

    assert "--no-fused-ops promises standard ONNX ops only" in fail(
        "export", "--preset", "tiny", "--no-fused-ops", "--quantize", "int8", "-o", tmp_path / "m.onnx", code=2)
    with pytest.raises(ExportError, match="fused_ops=False promises standard ONNX ops only"):
        export(preset("tiny"), tmp_path / "m.onnx", quantize="int8", fused_ops=False)
    assert not (tmp_path / "m.onnx").exists()


def test_sigterm_ends_an_export_as_ctrl_c_does_leaving_no_staging(tmp_path):
    """timeout, docker stop and systemd send SIGTERM: the staging folder goes, as after Ctrl-C."""
    import signal
    import subprocess
    import time

    out = tmp_path / "m.onnx"
    child = subprocess.Popen([sys.executable, "-c", "from ortformer.cli import main; main()", "export", "--preset", "small", "-o", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob(".m.onnx.*")) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.poll() is None, "the export ended before it staged anything"
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 1 and "Aborted" in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_architecture_flags_with_from_are_a_usage_error(tmp_path):
    line = fail("export", "--from", tmp_path, "--layers", 3, "--norm-position", "pre", "--no-bias", "-o",
                tmp_path / "m.onnx", code=2)
    assert "--from takes the architecture from the checkpoint; drop --layers, --norm-position, --no-bias" in line


def test_from_a_plain_folder_takes_a_pooling(tmp_path):
    """A Hugging Face folder without sentence-transformers modules has no pooling of its own: --pooling and
    --normalize give it one, the normalised mean of transformers' hidden states over kept tokens."""
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch

    folder = tmp_path / "bert"
    config = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    model.save_pretrained(str(folder))
    out = tmp_path / "m.onnx"
    invoke("export", "--from", folder, "--pooling", "mean", "--normalize", "-o", out)
    ids, mask = np.array([[2, 7, 9, 4, 0], [3, 5, 0, 0, 0]]), np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    got = Runtime(out, "cpu").run(input_ids=ids, attention_mask=mask)["sentence_embedding"]
    with torch.no_grad():
        hidden = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    mean = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-5)


def test_an_ortformer_checkpoint_keeps_its_own_pooling(tmp_path):
    from ortformer.config import preset
    from ortformer.models import build_encoder, load_any
    from ortformer.models.checkpoint import save_checkpoint

    folder = save_checkpoint(build_encoder(preset("tiny")), tmp_path / "ckpt")
    assert load_any(folder).config.pooling == "mean"
    line = fail("export", "--from", folder, "--pooling", "cls", "-o", tmp_path / "m.onnx")
    assert "is an ortformer checkpoint, whose config.json sets its pooling" in line


def flipped_weight(src: Path, dest: Path) -> Path:
    """``src`` with one bit of its largest initializer flipped; the metadata kept as it was."""
    model = onnx.load(str(src))
    tensor = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    raw = bytearray(tensor.raw_data)
    raw[len(raw) // 2] ^= 0x01
    tensor.raw_data = bytes(raw)
    onnx.save(model, str(dest))
    return dest


def test_check_sees_a_weight_changed_after_export(tokens_model, tmp_path):
    assert read_model_file(tokens_model).metadata[contract.META_WEIGHTS].startswith("sha256:")
    assert "weights: match the recorded digest" in invoke("check", tokens_model).output
    damaged = flipped_weight(tokens_model, tmp_path / "flipped.onnx")
    assert "its weights differ from those recorded when it was written" in fail("check", damaged)
    # an optimized copy records a digest of its own: it must not launder a damaged source
    assert "its weights differ from those recorded" in fail("optimize", damaged, "-o", tmp_path / "opt.onnx")
    assert not (tmp_path / "opt.onnx").exists()


def test_a_file_without_a_digest_is_checked_and_says_so(tokens_model, tmp_path):
    model = onnx.load(str(tokens_model))  # as files exported before the digest was recorded
    kept = [p for p in model.metadata_props if p.key != contract.META_WEIGHTS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(tmp_path / "old.onnx"))
    assert "weights: no digest recorded" in invoke("check", tmp_path / "old.onnx").output


def test_optimize_records_the_copy_s_own_digest(tokens_model, tmp_path):
    out = tmp_path / "opt.onnx"
    invoke("optimize", tokens_model, "-o", out)
    # the rewrites may fold or add weights: the copy records the digest of its own
    assert read_model_file(out).metadata[contract.META_WEIGHTS] == file_weights_digest(out)
    assert "weights: match the recorded digest" in invoke("check", out).output
