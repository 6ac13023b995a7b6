"""LLM yes/no rerankers (Qwen3-Reranker on Qwen3, mxbai-rerank-v2 on Qwen2): tiny random causal LMs
saved under the real folders' names with a byte-level BPE tokenizer, against transformers'
*ForCausalLM with the model cards' formulas (P(yes) = softmax over [no, yes] at the last token;
z_1 - z_0), with left and right padding; the cards' input ids; the template in the file's
metadata; and /rerank and /predict through ortformer serve."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from support.hf import GATE, save_hf, transformers

from ortformer import contract
from ortformer.core.errors import InputError, ModelFileError
from ortformer.exporter import export
from ortformer.models import load_any
from ortformer.modelfile import read_model_file
from ortformer.runtime import Runtime

tokenizers = pytest.importorskip("tokenizers")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CORPUS = ["yes no yes no 0 1 0 1 query document relevance", "Judge whether the Document meets the requirements",
          "Given a web search query, retrieve relevant passages that answer the query",
          "You are a search relevance expert who evaluates how well documents match search queries.",
          "The capital of China is Beijing. Gravity is a force that attracts two bodies towards each other."]
VOCAB = 400
QUERY = "What is the capital of China?"
DOCS = ["The capital of China is Beijing.", "Gravity is a force.", "yes",
        "A longer passage about gravity, planets and the sun, with more words than the others have in it."]
KINDS = {  # folder name -> (causal LM class, config class, tied LM head)
    "Qwen3-Reranker-tiny": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, True),
    "mxbai-rerank-base-v2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, False),
}


def byte_bpe(folder) -> "tokenizers.Tokenizer":
    """A Qwen-like byte-level BPE (no special tokens added around texts) trained on CORPUS, saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer)
    for word in ("yes", "no"):  # the cards read the logits of these tokens: they are vocabulary entries
        assert tok.token_to_id(word) is not None, word
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


@pytest.fixture(scope="module", params=sorted(KINDS))
def reranker(request, tmp_path_factory):
    """(folder, exported path, causal LM class)."""
    cls, config_cls, tied = KINDS[request.param]
    config = config_cls(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=512,
                        tie_word_embeddings=tied, pad_token_id=0, architectures=[cls.__name__])
    root = tmp_path_factory.mktemp("reranker")
    folder = save_hf(cls, config, root / request.param, seed=3)
    byte_bpe(folder)
    loaded = load_any(folder)
    path = root / "r.onnx"
    export(loaded.model, path, **loaded.export_options(True))
    return folder, path, cls


def card_ids(folder, kind: str, query: str, document: str) -> list[int]:
    """The input ids as the model cards build them, with transformers' tokenizer."""
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    if kind.startswith("Qwen3"):
        prefix = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
                  'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
        suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        instruction = "Given a web search query, retrieve relevant passages that answer the query"
        return ids(prefix) + ids(f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}") + ids(suffix)
    prefix = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\n")
    task = ("You are a search relevance expert who evaluates how well documents match search queries. For each "
            "query-document pair, carefully analyze the semantic relationship between them, then provide your "
            "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:")
    return (ids(prefix) + ids(f"query: {query}") + ids("\n") + ids(f"document: {document}") + ids("\n") + ids(task)
            + ids("<|im_end|>\n<|im_start|>assistant\n"))


def card_scores(model, folder, kind: str, rows: list[list[int]], side: str) -> np.ndarray:
    """The cards' formula on transformers' causal LM, the batch padded on ``side``."""
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    yes, no = ("yes", "no") if kind.startswith("Qwen3") else ("1", "0")
    n = max(map(len, rows))
    ids = np.zeros((len(rows), n), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        where = slice(n - len(row), n) if side == "left" else slice(0, len(row))
        ids[i, where], mask[i, where] = row, 1
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
    last = logits[torch.arange(len(rows)), torch.tensor([n - 1 if side == "left" else len(r) - 1 for r in rows])]
    pair = torch.stack([last[:, tok.token_to_id(no)], last[:, tok.token_to_id(yes)]], dim=1)  # [no, yes]
    if kind.startswith("Qwen3"):
        return torch.softmax(pair.double(), dim=1)[:, 1].numpy()  # P(yes)
    return (pair[:, 1] - pair[:, 0]).double().numpy()  # mxbai-rerank-v2: z_1 - z_0


def test_scores_equal_the_cards_formula_on_transformers(reranker):
    folder, path, cls = reranker
    kind = folder.name
    runtime = Runtime(path, "cpu")
    rows = runtime.rerank_ids(QUERY, DOCS)
    assert rows == [card_ids(folder, kind, QUERY, d) for d in DOCS]  # the cards' input ids
    model = cls.from_pretrained(str(folder), attn_implementation="eager").eval()
    got = runtime.rerank(QUERY, DOCS)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    template = runtime.rerank_template
    for side in ("left", "right"):
        want = card_scores(model, folder, kind, rows, side)
        assert np.abs(got - want).max() <= GATE["max_abs"], (side, got, want)
        n = max(map(len, rows))  # the file itself, padded the same way
        ids = np.zeros((len(rows), n), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            where = slice(n - len(row), n) if side == "left" else slice(0, len(row))
            ids[i, where], mask[i, where] = row, 1
        d = session.run([contract.LOGITS], {"input_ids": ids, "attention_mask": mask})[0][:, 0]
        assert np.abs(np.array(template.scores(d)) - want).max() <= GATE["max_abs"], side
    assert np.ptp(want) > 1e-3  # the documents score differently: a constant head would not pass


def test_the_file_keeps_two_rows_of_the_lm_head_and_its_template(reranker):
    folder, path, _ = reranker
    graph = onnx.load(str(path)).graph
    vocab_sized = [t.name for t in graph.initializer if VOCAB in t.dims]
    assert len(vocab_sized) == 1  # the token table only: no (V, F) LM head
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    template = json.loads(meta[contract.META_RERANK])
    assert ("{document}" in "".join(template["segments"])) and template["score"] in ("sigmoid", "logit")
    model_file = read_model_file(path)
    assert model_file.config.classifier.labels == 1 and model_file.labels == ["relevance"]
    from click.testing import CliRunner

    from ortformer.cli import cli

    report = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).output)
    assert report["rerank_template"] == template
    assert "rerank      logits d = z[" in CliRunner().invoke(cli, ["info", str(path)]).output


def test_instruction_and_truncation(reranker):
    folder, path, _ = reranker
    runtime = Runtime(path, "cpu")
    template = runtime.rerank_template
    custom = runtime.rerank_ids(QUERY, DOCS[:1], instruction="Find the city")[0]
    default = runtime.rerank_ids(QUERY, DOCS[:1])[0]
    assert custom != default
    long_doc = "gravity " * 400
    full = runtime.rerank_ids(QUERY, [long_doc])[0]  # text_max_length: max_position_embeddings
    cut = runtime.rerank_ids(QUERY, [long_doc], max_length=300)[0]
    assert len(cut) == 300 and len(full) == 512
    tail = len(runtime._text_encoder_checked().plain_ids(template.texts(QUERY, long_doc)[-1]))
    assert cut[-tail:] == full[-tail:]  # the template's end is kept; the document is cut
    with pytest.raises(InputError, match="template takes .* tokens besides the text it truncates"):
        runtime.rerank_ids(QUERY, [long_doc], max_length=20)


def test_a_bad_template_is_refused_on_read(reranker, tmp_path):
    from support.text_models import set_metadata

    _, path, _ = reranker
    for value, why in [("{", "not valid JSON"), (json.dumps({"segments": ["{query} only"]}), "{document}"),
                       (json.dumps({"segments": ["{query}{document}"], "score": "softmax"}), "score='softmax'")]:
        bad = set_metadata(path, contract.META_RERANK, value, tmp_path / "bad.onnx")
        with pytest.raises(ModelFileError, match="rerank_template"):
            read_model_file(bad)
        with pytest.raises(ModelFileError, match=__import__("re").escape(why)):
            read_model_file(bad)


def test_rerank_and_predict_through_serve(reranker):
    import httpx
    from support.serve import serving

    from ortformer.runtime import Runtime as R

    folder, path, _ = reranker
    runtime = R(path, "cpu")
    want = runtime.rerank(QUERY, DOCS)
    with serving({"r": runtime}, ["r"]) as running:
        ranked = httpx.post(f"{running.url}/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True},
                            timeout=30).json()
        d = np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])])
        np.testing.assert_allclose(runtime.rerank_template.scores(d), want, atol=1e-5)
        predicted = httpx.post(f"{running.url}/predict", json={"inputs": [[QUERY, DOCS[0]]], "raw_scores": True},
                               timeout=30).json()
        np.testing.assert_allclose(runtime.rerank_template.scores([predicted[0][0]["score"]]), want[:1], atol=1e-5)
        # the Cohere / Jina route scores the same pairs as /rerank: the same numbers, sorted descending
        plain = httpx.post(f"{running.url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=30).json()
        cohere = httpx.post(f"{running.url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2},
                            timeout=30).json()["results"]
        best = sorted(plain, key=lambda r: -r["score"])[:2]
        assert [r["index"] for r in cohere] == [r["index"] for r in best]
        assert [r["relevance_score"] for r in cohere] == [r["score"] for r in best]
        assert [r["document"]["text"] for r in cohere] == [DOCS[r["index"]] for r in best]
        lone = httpx.post(f"{running.url}/predict", json={"inputs": QUERY}, timeout=30)
        # TEI's validation error (413 before TEI 1.9, 422 since)
        assert lone.json()["error_type"] == "validation" and "[query, document] pairs" in lone.json()["error"]


def test_a_template_on_a_model_without_a_one_label_last_token_head_is_refused(tokens_model, tmp_path):
    from support.text_models import set_metadata

    from ortformer.models.hf.llm_reranker import TEMPLATES

    bad = set_metadata(tokens_model, contract.META_RERANK, TEMPLATES["qwen3-reranker"][1].to_json(), tmp_path / "e.onnx")
    with pytest.raises(ModelFileError, match="one-label per-sequence classifier on the last token"):
        read_model_file(bad)


def test_a_reranker_is_recognised_by_its_folder_name_and_architecture(tmp_path):
    from ortformer.core.errors import CheckpointError
    from ortformer.models.hf.llm_reranker import template_name

    causal = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert template_name(tmp_path / "Qwen3-Reranker-0.6B", causal) == "qwen3-reranker"
    assert template_name(tmp_path / "Qwen3-Embedding-0.6B", causal) is None  # a causal LM, not a reranker
    assert template_name(tmp_path / "Qwen3-Reranker-0.6B", {**causal, "architectures": ["Qwen3Model"]}) is None
    assert template_name(tmp_path / "mxbai-rerank-large-v2", {"model_type": "qwen2",
                                                               "architectures": ["Qwen2ForCausalLM"]}) == "mxbai-rerank-v2"
    with pytest.raises(CheckpointError, match="holds a qwen3 model.*model_type='qwen2'"):
        template_name(tmp_path / "Qwen3-Reranker-4B", {**causal, "model_type": "qwen2"})
