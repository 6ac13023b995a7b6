"""Late interaction: PyLate, sentence-transformers multi-vector and colbert-ai folders export their
per-token projection, and Runtime.embed_texts(kind=...) and maxsim give what the reference
implementations compute. The oracles are PyLate's and colbert-ai's formulas written out in torch
over transformers' own model and tokenizer (neither package is a dependency), and
sentence-transformers itself for its multi-vector layout. bge-m3: test_bge_m3.py."""
from __future__ import annotations

import json
import shutil
import string

import numpy as np
import pytest
import torch
from support.hf import save_hf, transformers
from support.late import DOCS, QUERIES, SMALL, cli, close, exported, hf_tokenizer, pylate_layout, with_late

from ortformer import contract
from ortformer.config import EncoderConfig, TokenDense
from ortformer.core.errors import CheckpointError, ConfigError, InputError, ModelFileError
from ortformer.contract.late import LateInteraction
from ortformer.models import load_any
from ortformer.runtime import Runtime

st = pytest.importorskip("sentence_transformers")


def bert(folder, vocab, cls=None, **changes):
    config = transformers.BertConfig(vocab_size=vocab, max_position_embeddings=64, **SMALL, **changes)
    return save_hf(cls or transformers.BertModel, config, folder, random_biases=True)


def insert_marker(ids: torch.Tensor, marker: int) -> torch.Tensor:
    """PyLate's insert_prefix_token / colbert-ai's _insert_prefix_token: the marker after the first token."""
    return torch.cat([ids[:, :1], torch.full((ids.shape[0], 1), marker), ids[:, 1:]], dim=1)


# ---------------------------------------------------------------- the heads in the encoder


@pytest.mark.parametrize("fields", [dict(token_dense=TokenDense(size=8)), dict(token_weights=True, pooling="cls"),
                                    dict(token_dense=TokenDense(size=8, bias=True), token_weights=True)])
def test_token_heads_outputs_and_parameter_count(fields):
    from ortformer.config import preset
    from ortformer.contract.cost import parameter_count
    from ortformer.models import build_encoder

    cfg = preset("tiny", **fields)
    model = build_encoder(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    ids, mask = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 1, 1, 0]])
    with torch.no_grad():
        out = model(ids, mask)
    assert list(out) == contract.output_names(cfg)  # the graph's outputs come in the contract's order
    x = out["last_hidden_state"]
    if cfg.token_dense:
        want = torch.nn.functional.normalize(x @ model.token_dense.weight.T + (model.token_dense.bias if
                                             cfg.token_dense.bias else 0), dim=-1)
        torch.testing.assert_close(out["token_embeddings"], want)  # every position, the padded one too
    if cfg.token_weights:
        torch.testing.assert_close(out["sparse"], torch.relu(x @ model.token_weight.weight.T + model.token_weight.bias)[..., 0])


def test_token_head_fields_are_checked():
    from ortformer.config import preset
    from ortformer.core.errors import ConfigError
    from ortformer.models.chunk_stages import chunkable

    # a bias without the head: only format 1's flat fields can say that, and its reader refuses it
    with pytest.raises(ConfigError, match="token_dense_bias shapes token_dense; with token_dense_size=0 there is none"):
        EncoderConfig.from_dict({"format": 1, "token_dense_bias": True})
    with pytest.raises(ConfigError, match="token_dense.size=-1 must be >= 1"):
        preset("tiny", token_dense=TokenDense(size=-1))
    with pytest.raises(ConfigError, match="token_dense.size=0 must be >= 1 \\(no head: token_dense null / None\\)"):
        preset("tiny", token_dense={"size": 0})
    assert "per-token heads" in chunkable(preset("tiny", attention="linear", token_dense=TokenDense(size=8)))


# ---------------------------------------------------------------- PyLate


PYLATE = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 12, "document_length": 20,
          "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation), "do_query_expansion": True,
          "model_type": "ColBERT"}


def pylate_folder(root, attend=False):
    """A PyLate ColBERT folder as PyLate saves one: the tokenizer with its "[Q] " / "[D] " tokens
    added, a Transformer module at the root, a bias-free Dense to 16 in 1_Dense, and its settings."""
    tok = hf_tokenizer()
    tok.add_tokens(["[Q] ", "[D] "])
    folder = bert(root / f"pylate{int(attend)}", len(tok))
    tok.save_pretrained(str(folder))
    torch.manual_seed(1)
    dense = torch.randn(16, 32) / 4
    pylate_layout(folder, dense, {**PYLATE, "attend_to_expansion_tokens": attend})
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 19, "do_lower_case": False}))
    return folder, tok, dense


def pylate_oracle(folder, tok, dense, texts, is_query, attend):
    """PyLate's ColBERT.tokenize + encode: max_seq_length = length - 1, queries padded to it with
    [MASK] (pad_token_id = mask_token_id), the prefix id inserted after [CLS], attention filled with
    ones when attending to expansion tokens; Dense; documents keep skiplist & attention; normalize."""
    model = transformers.BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    tok.pad_token = tok.mask_token
    length = PYLATE["query_length" if is_query else "document_length"]
    enc = tok(texts, padding="max_length" if is_query else True, truncation=True, max_length=length - 1,
              return_tensors="pt")
    prefix = tok.convert_tokens_to_ids(PYLATE["query_prefix" if is_query else "document_prefix"])
    ids, mask = insert_marker(enc["input_ids"], prefix), insert_marker(enc["attention_mask"], 1)
    types = torch.zeros_like(ids)
    if is_query and attend:
        mask = torch.ones_like(mask)
    with torch.no_grad():
        tokens = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state @ dense.T
    if is_query:
        keep = torch.ones_like(ids, dtype=torch.bool)
    else:
        skip = torch.tensor([tok.convert_tokens_to_ids(w) for w in PYLATE["skiplist_words"]])
        keep = ~torch.isin(ids, skip) & mask.bool()
    return [torch.nn.functional.normalize(t[k], p=2, dim=1).numpy() for t, k in zip(tokens, keep)]


@pytest.fixture(scope="module")
def pylate(tmp_path_factory):
    root = tmp_path_factory.mktemp("pylate")
    folder, tok, dense = pylate_folder(root)
    return folder, tok, dense, exported(folder, root / "colbert.onnx")


def test_pylate_folder_exports_token_embeddings_and_settings(pylate):
    folder, tok, _, rt = pylate
    assert contract.TOKEN_EMBEDDINGS in rt.output_names and rt.config.token_dense == TokenDense(size=16, bias=False)
    assert rt.parity["passed"]
    assert rt.parity["worst"][contract.TOKEN_EMBEDDINGS]["passed"]
    # real sentences through its tokenizer too, per kept token (recorded, not gated)
    assert rt.parity["text"]["output"] == contract.TOKEN_EMBEDDINGS and rt.parity["text"]["min_cosine"] > 0.99999
    late = rt.late
    assert (late.query_marker, late.document_marker) == tuple(tok.convert_tokens_to_ids(["[Q] ", "[D] "]))
    assert (late.query_length, late.document_length, late.expansion_id) == (12, 20, tok.mask_token_id)
    assert tok.convert_tokens_to_ids(".") in late.skiplist and not late.attend_to_expansion


@pytest.mark.parametrize("kind", ["query", "document"])
def test_pylate_vectors_equal_pylates_encode(pylate, kind):
    folder, tok, dense, rt = pylate
    texts = QUERIES if kind == "query" else DOCS
    got = rt.embed_texts(texts, kind=kind)
    close(got, pylate_oracle(folder, tok, dense, texts, kind == "query", attend=False))
    if kind == "query":  # every query holds query_length vectors, expansion tokens included
        assert {len(g) for g in got} == {12}
    else:  # the skiplist drops punctuation: "!" of the first document
        assert len(got[0]) == len(tok("The cat sat on the mat!")["input_ids"])  # +1 marker -1 "!"




def test_pylate_attending_to_expansion_tokens(pylate):
    # attend_to_expansion_tokens changes what the runtime feeds (the attention mask), not the graph
    folder, tok, dense, rt = pylate
    attending = Runtime(with_late(rt, "attend.onnx", attend_to_expansion=True), provider="cpu")
    close(attending.embed_texts(QUERIES, kind="query"), pylate_oracle(folder, tok, dense, QUERIES, True, attend=True))
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps({**settings, "attend_to_expansion_tokens": True}))
    try:
        assert load_any(folder).late().attend_to_expansion
    finally:
        (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))


def test_maxsim_is_colberts_score(pylate):
    *_, rt = pylate
    query = rt.embed_texts(QUERIES[:1], kind="query")[0]
    docs = rt.embed_texts(DOCS, kind="document")
    want = [float((torch.from_numpy(query) @ torch.from_numpy(d).T).max(dim=1).values.sum()) for d in docs]
    np.testing.assert_allclose(rt.maxsim(query, docs), want, rtol=1e-6, atol=1e-6)
    assert rt.maxsim(query, []).shape == (0,)
    with pytest.raises(InputError, match="hold no vectors"):
        rt.maxsim(query, [docs[0], np.zeros((0, 16), np.float32)])
    with pytest.raises(InputError, match=r"expected token vectors \(n, 16\)"):
        rt.maxsim(query, [np.ones((3, 8))])


def test_kind_and_length_are_checked(pylate):
    *_, rt = pylate
    with pytest.raises(InputError, match="kind='passage' is not valid"):
        rt.embed_texts(DOCS, kind="passage")
    # max_length replaces the query length: queries expand to it (PyLate's query_length argument)
    assert {len(q) for q in rt.embed_texts(QUERIES, kind="query", max_length=20)} == {20}
    with pytest.raises(InputError, match="max_length"):
        rt.embed_texts(QUERIES, kind="query", max_length=3)  # [CLS] [Q] [SEP]: no room for a token
    with pytest.raises(InputError, match="pairs join two texts"):
        rt.embed_texts(QUERIES, kind="query", pairs=QUERIES)
    with pytest.raises(InputError, match=r"\['sparse'\] are not among this model's outputs"):
        rt.embed_texts(QUERIES, output="sparse")  # a ColBERT model has no sparse weights


# ---------------------------------------------------------------- sentence-transformers multi-vector


def test_sentence_transformers_multi_vector_layout_equals_encode(tmp_path):
    # the import alone (the runtime's path is PyLate's, above): the eager model's token_embeddings
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Transformer

    tok = hf_tokenizer()
    base = bert(tmp_path / "base", len(tok))
    tok.save_pretrained(str(base))
    torch.manual_seed(2)
    model = st.SentenceTransformer(modules=[
        Transformer(str(base), max_seq_length=24),
        Dense(32, 8, bias=True, activation_function=torch.nn.Identity(), module_input_name="token_embeddings"),
        Normalize(module_input_name="token_embeddings")], device="cpu")
    folder = tmp_path / "multi"
    model.save(str(folder))
    loaded = load_any(folder)
    assert loaded.config.token_dense.bias and loaded.late() == LateInteraction()
    want = model.encode(DOCS, output_value="token_embeddings", convert_to_numpy=False)
    enc = tok(DOCS, padding=True, truncation=True, max_length=24, return_tensors="pt")
    with torch.no_grad():
        got = loaded.model(enc["input_ids"], enc["attention_mask"], torch.zeros_like(enc["input_ids"]))
    kept = [t[m.bool()].numpy() for t, m in zip(got["token_embeddings"], enc["attention_mask"])]
    close(kept, [w.numpy() for w in want])


def test_a_token_dense_without_normalize_is_refused(tmp_path):
    from sentence_transformers.sentence_transformer.modules import Dense, Transformer

    tok = hf_tokenizer()
    base = bert(tmp_path / "base", len(tok))
    tok.save_pretrained(str(base))
    model = st.SentenceTransformer(modules=[Transformer(str(base)), Dense(32, 8, module_input_name="token_embeddings")],
                                   device="cpu")
    model.save(str(tmp_path / "plain"))
    with pytest.raises(CheckpointError, match="need a Normalize of token_embeddings"):
        load_any(tmp_path / "plain")


# ---------------------------------------------------------------- colbert-ai


COLBERT_AI = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 10, "doc_maxlen": 16,
              "mask_punctuation": True, "attend_to_mask_tokens": False, "dim": 8}


@pytest.fixture(scope="module")
def colbert_ai(tmp_path_factory):
    """An HF_ColBERT checkpoint as colbert-ai saves it: bert.* and linear.weight in one file."""
    root = tmp_path_factory.mktemp("colbert_ai")
    tok = hf_tokenizer()
    base = bert(root / "base", len(tok))
    folder = root / "colbertv2"
    folder.mkdir()
    from safetensors.torch import load_file, save_file

    torch.manual_seed(3)
    linear = torch.randn(8, 32) / 4
    state = {f"bert.{k}": v for k, v in load_file(str(base / "model.safetensors")).items()}
    save_file({**state, "linear.weight": linear}, str(folder / "model.safetensors"))
    config = json.loads((base / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))
    (folder / "artifact.metadata").write_text(json.dumps(COLBERT_AI))
    tok.save_pretrained(str(folder))
    return folder, base, tok, linear, exported(folder, root / "colbertv2.onnx")


def colbert_ai_oracle(base, tok, linear, texts, is_query):
    """colbert-ai's QueryTokenizer / DocTokenizer.tensorize and ColBERT.query / doc."""
    model = transformers.BertModel.from_pretrained(str(base), attn_implementation="eager").eval()
    if is_query:
        enc = tok(texts, padding="max_length", truncation=True, max_length=COLBERT_AI["query_maxlen"] - 1,
                  return_tensors="pt")
        ids = insert_marker(enc["input_ids"], tok.convert_tokens_to_ids("[unused0]"))
        mask = insert_marker(enc["attention_mask"], 1)
        ids[ids == tok.pad_token_id] = tok.mask_token_id
        skiplist = []
    else:
        enc = tok(texts, padding="longest", truncation="longest_first", max_length=COLBERT_AI["doc_maxlen"] - 1,
                  return_tensors="pt")
        ids = insert_marker(enc["input_ids"], tok.convert_tokens_to_ids("[unused1]"))
        mask = insert_marker(enc["attention_mask"], 1)
        skiplist = [tok.encode(s, add_special_tokens=False)[0] for s in string.punctuation]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state @ linear.T
    keep = torch.tensor([[(x not in skiplist) and (x != tok.pad_token_id) for x in row] for row in ids.tolist()])
    out = torch.nn.functional.normalize(out * keep[:, :, None].float(), p=2, dim=2)
    return [o[k].numpy() for o, k in zip(out, keep)]


@pytest.mark.parametrize("kind", ["query", "document"])
def test_colbert_ai_vectors_equal_colbert_ai(colbert_ai, kind):
    folder, base, tok, linear, rt = colbert_ai
    assert rt.config.token_dense.size == 8 and rt.parity["passed"]
    texts = QUERIES if kind == "query" else DOCS
    close(rt.embed_texts(texts, kind=kind), colbert_ai_oracle(base, tok, linear, texts, kind == "query"))


def test_colbert_ai_dim_must_match_its_projection(colbert_ai, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(colbert_ai[0], folder)
    (folder / "artifact.metadata").write_text(json.dumps({**COLBERT_AI, "dim": 128}))
    with pytest.raises(CheckpointError, match="dim=128 but linear.weight projects to 8"):
        load_any(folder)


def test_late_metadata_is_validated(pylate):
    *_, rt = pylate
    with pytest.raises(ModelFileError, match="outside the vocabulary"):
        Runtime(with_late(rt, "bad.onnx", skiplist=[10 ** 6]), provider="cpu")
    with pytest.raises(ModelFileError, match="query_length=100 is longer than the model takes"):
        Runtime(with_late(rt, "long.onnx", query_length=100), provider="cpu")


# ---------------------------------------------------------------- the command line and `check`


def test_infer_tensor_token_embeddings(pylate):
    *_, colbert = pylate
    result = cli("infer", colbert.path, "--text", QUERIES[0], "--text", QUERIES[1], "--kind", "query",
                 "--tensor", "token_embeddings")
    assert result.exit_code == 0, result.output
    close([np.array(rows, np.float32) for rows in json.loads(result.stdout)], colbert.embed_texts(QUERIES[:2], kind="query"))
    result = cli("infer", colbert.path, "--text", DOCS[0], "--kind", "query", "--tensor", "last_hidden_state")
    assert result.exit_code == 2 and "--kind reads texts for late interaction" in result.output


def test_check_refuses_a_file_whose_settings_differ_from_the_folder(colbert_ai):
    from ortformer.exporter.verify import verify

    folder, *_, colbert = colbert_ai
    other = Runtime(with_late(colbert, "other.onnx", query_length=12), provider="cpu")  # another model for texts
    with pytest.raises(ConfigError, match="late-interaction settings"):
        verify(other.path, against=folder)


def test_serve_embed_all_gives_each_texts_kept_vectors(pylate):
    """ortformer serve's /embed_all of a ColBERT model: Runtime.embed_texts' vectors, as queries or
    documents (`kind`), from batches of several clients' texts; ids and other routes refused."""
    httpx = pytest.importorskip("httpx")
    from support.serve import serving

    *_, rt = pylate
    with serving({"colbert": rt}, ["colbert"]) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        for kind, texts in (("query", QUERIES), ("document", DOCS)):
            answer = client.post("/embed_all", json={"inputs": texts, "kind": kind})
            assert answer.status_code == 200, answer.text
            close([np.array(v, np.float32) for v in answer.json()], rt.embed_texts(texts, kind=kind))
        default = client.post("/embed_all", json={"inputs": DOCS[0]}).json()  # a document unless told
        close([np.array(default[0], np.float32)], rt.embed_texts(DOCS[:1], kind="document"))
        for body, code, match in (({"inputs": DOCS, "kind": "passage"}, 422, "query"),
                                  ({"inputs": [[101, 102]]}, 422, "texts, not token ids")):
            answer = client.post("/embed_all", json=body)
            assert answer.status_code == code and match in answer.json()["error"], answer.text
        for route in ("/embed", "/embed_sparse"):
            assert client.post(route, json={"inputs": "x"}).status_code == 424
