"""bge-m3: an XLM-R folder with colbert_linear.pt and sparse_linear.pt exports one graph with
sentence_embedding, token_embeddings and sparse, and Runtime.embed_all gives FlagEmbedding's dense,
ColBERT and lexical weights, its formulas written out in torch as the oracle (FlagEmbedding is not
a dependency)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.hf import save_hf, transformers
from support.late import ATOL, DOCS, SMALL, cli, close, exported, hf_tokenizer

from ortformer import contract
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory):
    """A tiny XLM-R folder with bge-m3's colbert_linear.pt and sparse_linear.pt and its
    sentence-transformers modules (CLS pooling, Normalize)."""
    root = tmp_path_factory.mktemp("bge_m3")
    tok = hf_tokenizer()
    tok.add_special_tokens({"eos_token": "[SEP]"})  # FlagEmbedding drops cls, eos, pad and unk
    config = transformers.XLMRobertaConfig(vocab_size=len(tok), max_position_embeddings=66, pad_token_id=0,
                                           type_vocab_size=1, **SMALL)
    folder = save_hf(transformers.XLMRobertaModel, config, root / "m3", random_biases=True)
    tok.save_pretrained(str(folder))
    torch.manual_seed(4)
    colbert = torch.nn.Linear(32, 32)
    sparse = torch.nn.Linear(32, 1)
    with torch.no_grad():
        sparse.bias.fill_(0.05)  # some weights above zero, some clipped by the relu
    torch.save(colbert.state_dict(), folder / "colbert_linear.pt")
    torch.save(sparse.state_dict(), folder / "sparse_linear.pt")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                 "pooling_mode_cls_token": True}))
    (folder / "2_Normalize").mkdir()
    return folder, tok, colbert, sparse, exported(folder, root / "m3.onnx")


def flag_m3_oracle(folder, tok, colbert, sparse, texts):
    """FlagEmbedding's BGEM3 inference: dense = normalize(h[:, 0]); lexical weights: relu(sparse_linear(h))
    per token, max over an id's repeats, w > 0, cls / eos / pad / unk ids dropped; colbert_vecs =
    normalize(colbert_linear(h[:, 1:]) * mask[:, 1:]), the first tokens_num - 1 of them."""
    model = transformers.XLMRobertaModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    enc = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        h = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        dense = torch.nn.functional.normalize(h[:, 0], dim=-1).numpy()
        weights = torch.relu(sparse(h)).squeeze(-1).numpy()
        vecs = colbert(h[:, 1:]) * enc["attention_mask"][:, 1:][:, :, None].float()
        vecs = torch.nn.functional.normalize(vecs, dim=-1).numpy()
    unused = {tok.convert_tokens_to_ids(tok.special_tokens_map[t])
              for t in ("cls_token", "eos_token", "pad_token", "unk_token") if t in tok.special_tokens_map}
    lexical = []
    for w_row, ids in zip(weights, enc["input_ids"].tolist()):
        result = {}
        for w, idx in zip(w_row, ids):
            if idx not in unused and w > 0 and w > result.get(idx, 0):
                result[idx] = w
        lexical.append(result)
    colbert_vecs = [v[: int(m.sum()) - 1] for v, m in zip(vecs, enc["attention_mask"].numpy())]
    return dense, lexical, colbert_vecs


def test_bge_m3_three_outputs_in_one_graph_equal_flagembedding(bge_m3):
    folder, tok, colbert, sparse, rt = bge_m3
    # the dense vector is normalized in the graph, so the file also gives it before (last, optional)
    assert rt.output_names == ["last_hidden_state", "sentence_embedding", "token_embeddings", "sparse",
                               "sentence_embedding_unnormalized"]
    assert all(rt.parity["worst"][name]["passed"] for name in rt.output_names)
    texts = DOCS + ["the the the repeated repeated"]
    dense, lexical, vecs = flag_m3_oracle(folder, tok, colbert, sparse, texts)
    got = rt.embed_all(texts)
    np.testing.assert_allclose(got["sentence_embedding"], dense, atol=ATOL, rtol=0)
    raw = rt.embed_texts(texts, output="sentence_embedding_unnormalized")  # h[:, 0], before normalize()
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-2)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), dense, atol=ATOL, rtol=0)
    close(got["token_embeddings"], vecs)
    assert [sorted(g) for g in got["sparse"]] == [sorted(w) for w in lexical]
    for g, w in zip(got["sparse"], lexical):
        np.testing.assert_allclose([g[k] for k in sorted(g)], [w[k] for k in sorted(w)], atol=ATOL, rtol=0)
    assert tok.sep_token_id not in set().union(*got["sparse"])  # eos dropped
    assert got["sparse"] == rt.embed_texts(texts, output="sparse")
    np.testing.assert_array_equal(rt.embed_texts(texts, kind="query", output="sentence_embedding"),
                                  got["sentence_embedding"])  # bge-m3 has no markers: queries read alike


def test_bge_m3_files_are_read_weights_only(bge_m3, tmp_path):
    folder = tmp_path / "m3"
    shutil.copytree(bge_m3[0], folder)

    class Payload:  # a pickle that would run code on load
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"weight": Payload(), "bias": torch.zeros(1)}, folder / "sparse_linear.pt")
    with pytest.raises(CheckpointError, match="weights_only"):
        load_any(folder)
    (folder / "sparse_linear.pt").unlink()
    with pytest.raises(CheckpointError, match=r"\['sparse_linear.pt'\] missing"):
        load_any(folder)


def test_infer_tensor_sparse(bge_m3):
    *_, m3 = bge_m3
    result = cli("infer", m3.path, "--text", DOCS[0], "--tensor", "sparse")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    (want,) = m3.embed_texts(DOCS[:1], output="sparse")
    assert row["indices"] == sorted(want) and np.allclose(row["values"], [want[i] for i in sorted(want)])


def test_check_against_the_folder_reruns_the_gate_on_every_output(bge_m3):
    from ortformer.exporter.verify import verify

    folder, *_, m3 = bge_m3
    report = verify(m3.path, against=folder)["parity"]
    assert report["passed"] and {contract.TOKEN_EMBEDDINGS, contract.SPARSE} <= set(report["worst"])


def test_serve_gives_bge_m3s_three_outputs(bge_m3):
    """ortformer serve: /embed the dense vectors, /embed_sparse the lexical weights as TEI's
    [{index, value}] rows, /embed_all the ColBERT vectors, each equal to Runtime.embed_all's."""
    httpx = pytest.importorskip("httpx")
    from support.serve import serving

    *_, rt = bge_m3
    texts = DOCS + ["the the the repeated repeated"]
    want = rt.embed_all(texts)
    with serving({"m3": rt}, ["m3"]) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        dense = client.post("/embed", json={"inputs": texts})
        sparse = client.post("/embed_sparse", json={"inputs": texts})
        tokens = client.post("/embed_all", json={"inputs": texts})
    assert dense.status_code == sparse.status_code == tokens.status_code == 200, (dense.text, sparse.text)
    np.testing.assert_allclose(dense.json(), want["sentence_embedding"], atol=ATOL, rtol=0)
    for row, weights in zip(sparse.json(), want["sparse"]):
        assert [e["index"] for e in row] == sorted(weights)
        np.testing.assert_allclose([e["value"] for e in row], [weights[i] for i in sorted(weights)], atol=ATOL)
    close([np.array(v, np.float32) for v in tokens.json()], want["token_embeddings"])
