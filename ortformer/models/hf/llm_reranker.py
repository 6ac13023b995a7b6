"""LLM yes/no rerankers: a causal LM (Qwen3-Reranker on Qwen3, mxbai-rerank-v2 on Qwen2) that scores
a (query, document) prompt by the next-token logits of a "yes" and a "no" token at the last token.

The import keeps the encoder (the LM's decoder layers and final norm) and, of the LM head, only
the two rows it reads: one "score" row w = W_lm[yes] - W_lm[no] (the token table's rows when the
head is tied), so the graph's ``logits`` (B, 1) are d = w . h_last = z_yes - z_no at the last kept
token, a one-label classifier. The card's score is sigmoid(d) = softmax([z_no, z_yes])[1] = P(yes)
(Qwen3-Reranker) or d itself (mxbai-rerank-v2); the prompt template travels in the file
(contract/rerank_template.py).

A folder is recognised by its name (the hub repository's for a hub id): Qwen3-Reranker-*, or
mxbai-rerank-*-v2, with a *ForCausalLM architecture; config.json names no task.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...core.errors import CheckpointError
from ...contract.rerank_template import RerankTemplate
from ..weights import Tensors
from .folder_layout import find_tokenizer, folder_name
from .heads import ClassifierHead, HeadLayout

QWEN3_SYSTEM = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
                'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
MXBAI_TASK = ("You are a search relevance expert who evaluates how well documents match search queries. For each "
              "query-document pair, carefully analyze the semantic relationship between them, then provide your "
              "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:")
MXBAI_SYSTEM = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\n")

# the model cards' templates: Qwen3-Reranker tokenizes prefix, the formatted pair and suffix apart and
# truncates the pair; mxbai-rerank-v2 (its package) tokenizes prefix, the query (with the instruction when
# one is given), "\n", the document, "\n", the task prompt and suffix apart
TEMPLATES = {
    "qwen3-reranker": (("qwen3",), RerankTemplate(
        segments=(QWEN3_SYSTEM, "{instruction}<Query>: {query}\n<Document>: {document}",
                  "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        instruction="Given a web search query, retrieve relevant passages that answer the query",
        instruction_format="<Instruct>: {instruction}\n", truncate=1, score="sigmoid", yes="yes", no="no")),
    "mxbai-rerank-v2": (("qwen2",), RerankTemplate(
        segments=(MXBAI_SYSTEM, "{instruction}query: {query}", "\n", "document: {document}", "\n", MXBAI_TASK,
                  "<|im_end|>\n<|im_start|>assistant\n"),
        instruction="", instruction_format="instruction: {instruction}\n", truncate=3, score="logit",
        yes="1", no="0")),
}


def template_name(root: Path, hf: dict) -> str | None:
    """The reranker template a causal-LM folder's name calls for, or None (not a reranker)."""
    architectures = hf.get("architectures") or []
    if not (isinstance(architectures, list) and architectures and str(architectures[0]).endswith("ForCausalLM")):
        return None
    name = folder_name(root).lower()
    kind = ("qwen3-reranker" if "qwen3-reranker" in name
            else "mxbai-rerank-v2" if "mxbai-rerank" in name and "v2" in name else None)
    if kind is not None and hf.get("model_type") not in TEMPLATES[kind][0]:
        raise CheckpointError(f"{root}: a {kind} folder holds a {TEMPLATES[kind][0][0]} model, this config.json "
                              f"says model_type={hf.get('model_type')!r}")
    return kind


@dataclass(frozen=True)
class RerankerHead:
    """The one-label "score" head import_folder builds for a reranker, and its template."""
    template: RerankTemplate
    classifier: ClassifierHead
    yes_id: int
    no_id: int

    def tensors(self, raw: Tensors, what: str) -> Tensors:
        """``raw`` with score.weight = W_lm[yes] - W_lm[no] (1, F): lm_head.weight, else (tied) the token table."""
        import torch

        tables = [k for k in raw if k.endswith("embed_tokens.weight")]
        table = raw.get("lm_head.weight", raw[tables[0]] if len(tables) == 1 else None)
        if table is None:
            raise CheckpointError(f"{what}: a reranker reads the LM head's rows, and neither lm_head.weight nor one "
                                  "embed_tokens.weight is there")
        row = table[self.yes_id].to(torch.float32) - table[self.no_id].to(torch.float32)
        return {**raw, "score.weight": row[None, :]}


def reranker_head(root: Path, kind: str, hf: dict) -> RerankerHead:
    """The head and template of a ``kind`` reranker, its yes / no ids read from the folder's tokenizer."""
    from tokenizers import Tokenizer

    template = TEMPLATES[kind][1]
    path = find_tokenizer(root, root)
    if path is None:
        raise CheckpointError(f"{root}: a {kind} reranker needs its tokenizer.json (the yes / no tokens and the "
                              "template are read with it)")
    tokenizer = Tokenizer.from_file(str(path))
    ids = {token: tokenizer.token_to_id(token) for token in (template.yes, template.no)}
    vocab = hf.get("vocab_size", 0)
    bad = [t for t, i in ids.items() if i is None or not 0 <= i < vocab]
    if bad:
        raise CheckpointError(f"{path}: the reranker's answer token(s) {bad} are not in the vocabulary "
                              f"(vocab_size={vocab})")
    layout = HeadLayout(None, "score", "none", pooling="last", out_bias=False)  # the last kept token, by the mask
    return RerankerHead(template, ClassifierHead(False, layout, ("relevance",)), ids[template.yes], ids[template.no])
