"""ESM-2 protein language models (pre-norm, rotary, token dropout) and ESM's tokenizer, against
transformers and sentence-transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, hf_reference, load_and_export,
                        mean_pooling_layout, save_hf, st_embeddings, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

# ESM-2's vocabulary, in its order
VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO.-", "<null_1>", "<mask>"]
MASK, PAD = VOCAB.index("<mask>"), VOCAB.index("<pad>")


def tiny_config(**changes):
    base = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=40, pad_token_id=PAD, mask_token_id=MASK, position_embedding_type="rotary",
                token_dropout=True, emb_layer_norm_before=False)
    return transformers.EsmConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.EsmModel, tiny_config(), tmp_path_factory.mktemp("esm") / "m", seed=1)
    (folder / "vocab.txt").write_text("\n".join(VOCAB))
    transformers.EsmTokenizer(str(folder / "vocab.txt")).save_pretrained(str(folder))
    return folder, hf_reference(transformers.EsmModel, folder)


@pytest.fixture(scope="module")
def exported(saved, tmp_path_factory):
    return load_and_export(saved[0], tmp_path_factory.mktemp("esm_onnx") / "m.onnx")


def test_esm2_eager_and_onnx_equal_transformers(saved, exported):
    loaded, path = exported
    cfg = loaded.config
    assert loaded.family == "esm"
    assert (cfg.norm_position, cfg.positions, cfg.token_dropout_id, cfg.type_vocab_size) == ("pre", "rotary", MASK, 0)
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=PAD) >= 12


def test_masked_tokens_rescale_the_embeddings_as_transformers(saved, exported):
    """Token dropout: <mask> rows zeroed, every row scaled by 0.88 / (1 - masked share), per sequence."""
    loaded, path = exported
    ids = torch.tensor([[0, 5, MASK, 9, MASK, 12, 2, PAD], [0, MASK, 7, 8, 2, PAD, PAD, PAD], [0, 5, 6, 7, 8, 9, 10, 2]])
    mask = (ids != PAD).long()
    with torch.no_grad():
        want = saved[1](input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        eager = loaded.model(ids, mask)["last_hidden_state"].numpy()
    got = Runtime(path, "cpu").run(ids.numpy(), mask.numpy())["last_hidden_state"]
    kept = mask.numpy()[..., None].astype(bool)
    for ours in (eager, got):
        assert np.abs(np.where(kept, ours - want, 0)).max() < 1e-4
    unscaled = loaded.model.config.replace(token_dropout_id=-1)  # the check can fail: without the rescale
    from ortformer.models.encoder import Encoder

    plain = Encoder(unscaled).eval()
    plain.load_state_dict(loaded.model.state_dict())
    with torch.no_grad():
        assert np.abs(np.where(kept, plain(ids, mask)["last_hidden_state"].numpy() - want, 0)).max() > 1e-2


def test_learned_positions_equal_transformers(tmp_path):
    folder = save_hf(transformers.EsmModel, tiny_config(position_embedding_type="absolute", token_dropout=False),
                     tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert (loaded.config.positions, loaded.config.position_offset, loaded.config.token_dropout_id) == ("learned", 2, -1)
    assert_matches_transformers(loaded, hf_reference(transformers.EsmModel, folder), None, pad_id=PAD)


def test_esm1b_normalises_its_embeddings_as_transformers(tmp_path):
    # ESM-1b / ESM-1v: learned positions, token dropout, a LayerNorm on the embeddings before layer 0's own
    folder = save_hf(transformers.EsmModel, tiny_config(position_embedding_type="absolute", emb_layer_norm_before=True),
                     tmp_path / "m", seed=3)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx")
    assert (loaded.config.embedding_norm, loaded.config.first_block_norm, loaded.config.token_dropout_id) == (True, True, MASK)
    assert_matches_transformers(loaded, hf_reference(transformers.EsmModel, folder), path, pad_id=PAD)


def test_tokenizer_equals_esm_tokenizer(saved):
    from ortformer.models.hf.vocab_tokenizers import esm_tokenizer

    ours, theirs = esm_tokenizer(saved[0]), transformers.EsmTokenizer.from_pretrained(str(saved[0]))
    texts = ["MKTAYIAKQR", "M K T A", "mktay", "MKjjTA", "ACD<mask>EF", "AC  DE\tF", "<cls>AAA<eos>", "A.B-C", "J", "",
             "A<null_1>Z", "é漢字A", "MK\x1cTA", "A\x1dB\x1eC\x1fD"]
    for text in texts:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    assert ours.encode("MKT", "AYI").ids == theirs("MKT", "AYI")["input_ids"]


def test_mean_embeddings_of_sequences_equal_sentence_transformers(saved, tmp_path):
    folder = mean_pooling_layout(saved[0], 32, max_seq_length=38)
    _, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    proteins = ["MKTAYIAKQRQISFVKSHFSRQ", "MVLSPADKTNVKAAW", "GSHMAAAA<mask>KK", "M"]
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(proteins), st_embeddings(folder, proteins))


def test_stored_rotary_frequencies_are_checked_against_rope_theta(saved, tmp_path):
    """transformers computes with the frequency table the file stores: a half-precision save rounds
    it (warned), and a table of another theta than config.json's is refused."""
    from safetensors.torch import load_file, save_file

    with pytest.raises(CheckpointError, match="rotary frequencies other than those of config.json rope_theta=100"):
        load_any(with_config(saved[0], tmp_path / "theta", {"rope_theta": 100.0}))
    half = with_config(saved[0], tmp_path / "bf16", {})
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(str(half / "model.safetensors")).items()}
    assert any(k.endswith("inv_freq") for k in tensors)
    save_file(tensors, str(half / "model.safetensors"), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="rotary frequencies rounded to torch.bfloat16"):
        load_any(half)


@pytest.mark.parametrize("change, message", [
    ({"emb_layer_norm_before": "yes"}, "emb_layer_norm_before='yes' is not supported"),
    ({"is_folding_model": True}, "is_folding_model=True is not supported"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
    ({"mask_token_id": None}, "token_dropout=true needs an int mask_token_id"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
