"""Classifier heads of fine-tuned folders (*ForSequenceClassification, *ForTokenClassification),
and the masked-LM heads that SPLADE models pool.

A per-sequence head reads the first token: logits = W_o act(W_h x_0 + b_h) + b_o (B, L), which
is BERT's pooler + classifier, RoBERTa's / ELECTRA's / MPNet's classification head, DistilBERT's
pre_classifier + classifier and DeBERTa's context pooler + classifier; ModernBERT's reads the
first token or the mean and adds a norm: W_o norm(act(W_h v)) + b_o. A per-token head is one
Linear on every token, logits (B, N, L) (ModernBERT: its prediction head first). Decoders used as
encoders (Qwen3, Qwen2, Mistral, Llama, Gemma 1 / 2 / 3) score the last kept token that is not a pad id (the
first kept token when all are) with one Linear, "score". The tensors keep the names the task model saves them
under; the family's own loader drops them as before, and import_folder takes them from here.

An MLM head is a per-token head over the vocabulary, logits = W_e norm(act(W_h x_i + b_h)) + b_e
(B, N, V), whose decoder W_e is usually tied to the token embeddings (and then not saved).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config import Classifier
from ...core.errors import CheckpointError
from ..weights import Tensors
from .activations import head_activation


@dataclass(frozen=True)
class HeadLayout:
    dense: str | None  # the head's hidden Linear, as the task model names it, or None
    out: str  # the Linear that gives the logits
    activation: str  # after the hidden Linear: config.CLASSIFIER_DENSE
    norm: str | None = None  # a norm after the activation (ModernBERT), or None
    pooling: str = "cls"  # what a per-sequence head reads
    dense_bias_optional: bool = False  # a Dense saved without bias means zeros (ModernBERT's classifier_bias)
    # the output Linear has a saved bias; without (the decoders' score Linear) it is zeros, and a stray
    # saved bias is not read, as transformers builds no bias to load it into
    out_bias: bool = True
    pad_id: int = -1  # a per-sequence "last" head skips trailing tokens of this id (the decoders' pad_token_id)


# model_type -> the per-sequence head; a per-token head is "classifier" alone (ModernBERT: _modernbert_head)
SEQUENCE_HEADS = {
    "bert": HeadLayout("bert.pooler.dense", "classifier", "tanh"),
    "roberta": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "xlm-roberta": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "camembert": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "distilbert": HeadLayout("pre_classifier", "classifier", "relu"),
    "electra": HeadLayout("classifier.dense", "classifier.out_proj", "gelu"),
    "deberta-v2": HeadLayout("pooler.dense", "classifier", "gelu"),  # activation: pooler_hidden_act
    "deberta": HeadLayout("pooler.dense", "classifier", "gelu"),  # activation: pooler_hidden_act
    "mpnet": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "albert": HeadLayout("albert.pooler", "classifier", "tanh"),
    "nomic_bert": HeadLayout("nomic_bert.pooler.dense", "classifier", "tanh"),
    "gte": HeadLayout("gte.pooler.dense", "classifier", "tanh"),
    "new": HeadLayout("new.pooler.dense", "classifier", "tanh"),  # GTE's original NewForSequenceClassification
    "jina_embeddings_v3": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "eurobert": HeadLayout("dense", "classifier", "gelu"),  # pooling: classifier_pooling (_eurobert_pooling)
    "ultrabert": HeadLayout(None, "classifier", "none"),  # pooling: classifier_pooling (_cls_or_mean)
    "data2vec-text": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "xlm-roberta-xl": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "roberta-prelayernorm": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "megatron-bert": HeadLayout("bert.pooler.dense", "classifier", "tanh"),
    "ernie": HeadLayout("ernie.pooler.dense", "classifier", "tanh"),
    "esm": HeadLayout("classifier.dense", "classifier.out_proj", "tanh"),
    "roformer": HeadLayout("classifier.dense", "classifier.out_proj", "gelu"),  # activation: hidden_act (classifier_head)
}
# decoders used as encoders (transformers' GenericFor*Classification): one "score" Linear, without bias
# per sequence, on the last kept token whose id is not pad_token_id (_score_head); per token with a bias
# unless token_classification_bias is false
SCORE_HEADS = ("qwen3", "qwen2", "mistral", "llama", "gemma3_text", "gemma2", "gemma")
HEAD_FAMILIES = (*SEQUENCE_HEADS, "modernbert", *SCORE_HEADS)  # both tasks, in every one of them
# Longformer task models that turn global attention on themselves (sequence classification: the first
# token; question answering: the question; multiple choice: each choice's question)
LONGFORMER_GLOBAL = ("LongformerForSequenceClassification", "LongformerForQuestionAnswering",
                     "LongformerForMultipleChoice")


# model_type -> the masked-LM head: (Dense, norm, decoder, the decoder bias's other saved name)
MLM_HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.decoder",
             "cls.predictions.bias"),
    "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector", None),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
    "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
    "camembert": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
    "roberta-prelayernorm": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
    "modernbert": ("head.dense", "head.norm", "decoder", None),
}


@dataclass(frozen=True)
class ClassifierHead:
    """The head a folder's config.json and weights describe; ``fields`` gives its EncoderConfig group,
    config.Classifier (the config's description of the head, without the folder's names)."""
    per_token: bool
    layout: HeadLayout
    labels: tuple[str, ...]  # names by label id (none for an MLM head)
    width: int = 0  # L when the labels have no names (an MLM head: the vocabulary size)
    kind: str = "classifier"  # what the error messages call it
    tied: str | None = None  # an MLM decoder's bias under its other saved name

    @property
    def size(self) -> int:
        """L, the width of the logits."""
        return self.width or len(self.labels)

    def fields(self) -> dict:
        """The EncoderConfig fields of this head: its classifier group."""
        layout = self.layout
        return {"classifier": Classifier(
            labels=self.size, per_token=self.per_token, pooling=layout.pooling, norm=layout.norm is not None,
            dense=layout.activation if layout.dense is not None else "none", pad_id=layout.pad_id)}

    def tensors(self, raw: Tensors, hidden_size: int, norm_bias: bool, what: str) -> tuple[Tensors, set[str]]:
        """The head's weights under the Encoder's names, and the raw names they came from.
        A hidden Linear saved without a bias (ModernBERT's classifier_bias=false) gets zeros."""
        import torch

        F, L = hidden_size, self.size
        # (target, source, kind, shape, may be absent)
        parts = [("classifier", self.layout.out, "weight", (L, F), False)]
        if self.layout.out_bias:
            parts += [("classifier", self.layout.out, "bias", (L,), False)]
        if self.layout.dense is not None:
            parts += [("classifier_dense", self.layout.dense, "weight", (F, F), False),
                      ("classifier_dense", self.layout.dense, "bias", (F,), self.layout.dense_bias_optional)]
        if self.layout.norm is not None:
            parts += [("classifier_norm", self.layout.norm, "weight", (F,), False)]
            parts += [("classifier_norm", self.layout.norm, "bias", (F,), False)] if norm_bias else []
        mapped, used = {}, set()
        for target, source, kind, shape, optional in parts:
            name = f"{source}.{kind}"
            if name not in raw:
                if optional:
                    mapped[f"{target}.{kind}"] = torch.zeros(shape)
                    continue
                why = ("config.json's architectures names a classification model" if self.kind == "classifier"
                       else "a SPLADE model pools a masked-LM head")
                raise CheckpointError(f"{what}: the {self.kind} head's {name} is missing ({why})")
            if tuple(raw[name].shape) != shape:
                raise CheckpointError(f"{what}: {name} has shape {tuple(raw[name].shape)}, expected {shape} "
                                      f"({L} labels, hidden size {F})")
            mapped[f"{target}.{kind}"] = raw[name].to(torch.float32)
            used.add(name)
        if not self.layout.out_bias:
            mapped["classifier.bias"] = torch.zeros(L)
        return mapped, used


def mlm_head(hf: dict, model_type: str, what: str) -> ClassifierHead:
    """The masked-LM head SPLADE pools: Dense, activation, norm, decoder over the vocabulary."""
    if model_type not in MLM_HEADS:
        raise CheckpointError(f"{what}: a SPLADE model pools a masked-LM head; ortformer imports those of "
                              f"{', '.join(MLM_HEADS)}, not {model_type!r}")
    dense, norm, decoder, bias = MLM_HEADS[model_type]
    if model_type == "modernbert":
        layout = _modernbert_head(hf, what, per_token=True)
        decoder_bias = hf.get("decoder_bias", True)  # false: transformers builds the decoder without a bias
        if not isinstance(decoder_bias, bool):
            raise CheckpointError(f"{what} config.json decoder_bias={decoder_bias!r} must be true or false")
        layout = HeadLayout(layout.dense, decoder, layout.activation, norm, dense_bias_optional=True,
                            out_bias=decoder_bias)
    else:
        # BERT's transform uses hidden_act, DistilBERT's its activation, RoBERTa's lm_head always gelu
        key = {"bert": "hidden_act", "distilbert": "activation"}.get(model_type)
        act = head_activation(hf.get(key, "gelu") if key else "gelu", key, what)
        layout = HeadLayout(dense, decoder, act, norm)
    vocab = hf.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise CheckpointError(f"{what} config.json vocab_size={vocab!r} must be an int >= 1")
    return ClassifierHead(True, layout, (), width=vocab, kind="masked-LM", tied=bias)


def mlm_inputs(head: ClassifierHead, raw: Tensors, token_table) -> tuple[Tensors, set[str]]:
    """``raw`` with the decoder's weight and bias under the names ClassifierHead.tensors reads,
    and the raw names read under another name: a decoder tied to the token embeddings is saved
    without its weight, and some saves name the bias after the head (BERT's
    cls.predictions.bias) rather than the decoder."""
    out = head.layout.out
    filled = dict(raw)
    if f"{out}.weight" not in raw and token_table is not None:
        filled[f"{out}.weight"] = token_table
    if head.tied in raw and f"{out}.bias" not in raw:
        filled[f"{out}.bias"] = raw[head.tied]
    return filled, {head.tied} & set(raw)


def tie_decoder(model) -> bool:
    """Make a masked-LM decoder whose weight equals the token table the same Parameter as that table
    (as transformers ties it), so the exported graph holds one initializer for both (the Gather reads it,
    the decoder's MatMul its transpose); False, changing nothing, when they differ."""
    import torch

    decoder, table = model.classifier.weight, model.tokens.weight
    if decoder is table:
        return True
    if decoder.shape != table.shape or not torch.equal(decoder, table):
        return False
    model.classifier.weight = table
    return True


def classifier_head(hf: dict, model_type: str, what: str) -> ClassifierHead | None:
    """The classifier head config.json's ``architectures`` names, for the families above;
    None for a base model, another task, or a family whose head ortformer does not build."""
    architectures = hf.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else ""
    if not isinstance(architecture, str):
        return None
    if model_type == "longformer" and architecture in LONGFORMER_GLOBAL:
        # their encoders run with global attention the task model turns on itself: the encoder alone is another model
        raise CheckpointError(f"{what}: {architecture} gives tokens global attention, which ortformer does not implement "
                              "(Longformer imports with sliding windows only: LongformerModel, a sentence-transformers "
                              "folder, or LongformerForTokenClassification)")
    per_token = architecture.endswith("ForTokenClassification")
    if not (per_token or architecture.endswith("ForSequenceClassification")):
        return None
    if model_type in ("t5", "mt5", "longformer") and per_token:  # the encoder, then one Linear per token
        return ClassifierHead(True, HeadLayout(None, "classifier", "none"), _labels(hf, what))
    if model_type == "modernbert-decoder" and not per_token:  # the prediction head, then classifier, on the last token
        head = _modernbert_head(hf, what, per_token=True)
        bias = hf.get("classifier_bias", False)
        if not isinstance(bias, bool):
            raise CheckpointError(f"{what} config.json classifier_bias={bias!r} must be true or false")
        layout = HeadLayout(head.dense, head.out, head.activation, head.norm, pooling="last", dense_bias_optional=True,
                            out_bias=bias, pad_id=_pad_id(hf))
        return ClassifierHead(False, layout, _labels(hf, what))
    if model_type not in HEAD_FAMILIES:  # (T5ForSequenceClassification reads the decoder: not an encoder's head)
        return None
    layout = HeadLayout(None, "classifier", "none") if per_token else SEQUENCE_HEADS.get(model_type)
    if model_type in SCORE_HEADS:
        layout = _score_head(hf, what, per_token)
    elif model_type == "modernbert":
        layout = _modernbert_head(hf, what, per_token)
    elif model_type in ("deberta", "deberta-v2") and not per_token:
        act = head_activation(hf.get("pooler_hidden_act", "gelu"), "pooler_hidden_act", what)  # gelu_new -> gelu_tanh
        if hf.get("pooler_hidden_size", hf.get("hidden_size")) != hf.get("hidden_size"):
            raise CheckpointError(f"{what} config.json pooler_hidden_size={hf.get('pooler_hidden_size')!r} differs "
                                  f"from hidden_size={hf.get('hidden_size')!r}; ortformer's head keeps the width")
        layout = HeadLayout(layout.dense, layout.out, act)
    elif model_type == "roformer" and not per_token:  # RoFormerClassificationHead applies hidden_act
        layout = HeadLayout(layout.dense, layout.out, head_activation(hf.get("hidden_act", "gelu"), "hidden_act", what))
    elif model_type == "ultrabert" and not per_token:  # ModernBERT's classifier with an Identity head
        layout = HeadLayout(None, "classifier", "none", pooling=_cls_or_mean(hf, what))
    elif model_type == "eurobert" and not per_token:
        layout = HeadLayout(layout.dense, layout.out, layout.activation, pooling=_eurobert_pooling(hf, what))
    return ClassifierHead(per_token, layout, _labels(hf, what))


def _eurobert_pooling(hf: dict, what: str) -> str:
    """EuroBERT's classifier_pooling "bos" (the first token) or "mean" before its Dense; "late"
    (the Dense and the classifier on every token, then the mean of the logits) is not built."""
    pooling = hf.get("classifier_pooling", "late")
    if pooling not in ("bos", "mean"):
        raise CheckpointError(f"{what} config.json classifier_pooling={pooling!r} is not supported; ortformer "
                              "builds 'bos' and 'mean' (pool, then the Dense head), not 'late' (the mean of per-token logits)")
    return "cls" if pooling == "bos" else "mean"


def _score_head(hf: dict, what: str, per_token: bool) -> HeadLayout:
    """transformers' GenericFor*Classification "score" Linear: per token, with a bias unless
    token_classification_bias is false; per sequence, without one, on the last token whose id is not
    pad_token_id (transformers reads the ids alone, so a text that ends in pad ids, e.g. an eos used as
    pad, is scored at the token before them)."""
    if per_token:
        bias = hf.get("token_classification_bias", True)
        if not isinstance(bias, bool):
            raise CheckpointError(f"{what} config.json token_classification_bias={bias!r} must be true or false")
        return HeadLayout(None, "score", "none", out_bias=bias)
    return HeadLayout(None, "score", "none", pooling="last", out_bias=False, pad_id=_pad_id(hf))


def _pad_id(hf: dict) -> int:
    """pad_token_id, the id a "last" head skips at a text's end; -1 (none) when it is no token id."""
    pad = hf.get("pad_token_id")
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < hf.get("vocab_size", 0) else -1


def _cls_or_mean(hf: dict, what: str) -> str:
    """config.json's classifier_pooling: "cls" (the first token) or "mean"."""
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise CheckpointError(f"{what} config.json classifier_pooling={pooling!r} is not supported; valid: 'cls', 'mean'")
    return pooling


def _modernbert_head(hf: dict, what: str, per_token: bool) -> HeadLayout:
    """ModernBERT's prediction head, per token or on the pooled vector: norm(act(W v))."""
    ours = head_activation(hf.get("classifier_activation", "gelu"), "classifier_activation", what)
    pooling = "cls" if per_token else _cls_or_mean(hf, what)  # a per-token head pools nothing
    return HeadLayout("head.dense", "classifier", ours, "head.norm", pooling, dense_bias_optional=True)


def _labels(hf: dict, what: str) -> tuple[str, ...]:
    """Label names by id from id2label (transformers' LABEL_i when it names none)."""
    id2label = hf.get("id2label")
    count = hf.get("num_labels")
    if isinstance(id2label, dict) and id2label:
        try:
            by_id = {int(k): str(v) for k, v in id2label.items()}
        except (TypeError, ValueError):
            raise CheckpointError(f"{what} config.json id2label keys must be label ids, got {sorted(id2label)[:5]}") from None
        if sorted(by_id) != list(range(len(by_id))):
            raise CheckpointError(f"{what} config.json id2label must name labels 0..{len(by_id) - 1}, got ids {sorted(by_id)[:12]}")
        return tuple(by_id[i] for i in range(len(by_id)))
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        return tuple(f"LABEL_{i}" for i in range(count))
    return ("LABEL_0", "LABEL_1")  # transformers' default num_labels
