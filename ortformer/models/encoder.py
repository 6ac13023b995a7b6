"""The encoder: embeddings, L blocks, optional pooling, built from one config."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from .attention import MultiHeadAttention
from .layers import (AlibiBias, DisentangledPositions, FeedForward, Positions, RelativePositionBias, Rotary,
                     make_activation, make_norm, window_bias)
from .adapters import TokenAdapters, adapt_blocks
from .mixers import MixtureOfExperts, ShortConvolution


class Block(nn.Module):
    """One encoder layer.

    post-norm (BERT):  x = norm1(x + attn(x));  x = norm2(x + ffn(x))
    pre-norm:          x = x + attn(norm1(x));  x = x + ffn(norm2(x))
    sandwich (Gemma):  x = x + post_attention_norm(attn(norm1(x)));  x = x + post_ffn_norm(ffn(norm2(x)))

    Layer ``index`` may put a short convolution in place of attn (short_conv.layers, LFM2) and a
    mixture of experts in place of ffn (experts, NomicBERT-MoE): mixers.py.
    """

    def __init__(self, cfg: EncoderConfig, first: bool = False, index: int = 0):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.convolves = bool(cfg.short_conv) and index in cfg.short_conv.layers
        self.attention = ShortConvolution(cfg) if self.convolves else MultiHeadAttention(cfg.hidden_size, cfg.num_heads, cfg.attention, cfg.attention_eps,
                                            bias=cfg.bias, causal=cfg.causal, head_size=cfg.attention_head_size,
                                            position_projections=bool(cfg.disentangled) and cfg.disentangled.projections == "separate",
                                            qk_norm_eps=cfg.norm_eps if cfg.qk_norm else None,
                                            kv_heads=cfg.num_kv_heads or None, softcap=cfg.attention_softcap)
        # with embedding_norm the first block's input is already normalised (ModernBERT), unless the
        # model normalises it twice (first_block_norm: RoBERTa-PreLayerNorm)
        skip = first and cfg.embedding_norm and not cfg.first_block_norm
        self.norm1 = nn.Identity() if skip else make_norm(cfg)
        self.ffn = MixtureOfExperts(cfg) if cfg.experts and cfg.experts.has(index) else FeedForward(cfg)
        self.norm2 = make_norm(cfg)
        self.post_attention_norm = make_norm(cfg) if cfg.sandwich_norm else nn.Identity()
        self.post_ffn_norm = make_norm(cfg) if cfg.sandwich_norm else nn.Identity()

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, scores_bias: torch.Tensor | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                disentangled: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        def mix(h: torch.Tensor) -> torch.Tensor:
            if self.convolves:
                return self.attention(h, key_mask)
            return self.attention(h, key_mask, scores_bias, rotary, disentangled)

        if self.pre_norm:
            x = x + self.post_attention_norm(mix(self.norm1(x)))
            return x + self.post_ffn_norm(self.ffn(self.norm2(x)))
        x = self.norm1(x + mix(x))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    """forward(inputs, attention_mask[, token_type_ids]) -> dict of outputs.

    inputs: input_ids int64 (B, N) when vocab_size > 0, else inputs_embeds float (B, N, F).
    attention_mask: int (B, N), 1 = keep, 0 = padding.
    Returns last_hidden_state (B, N, F) and, when pooling is set, sentence_embedding (B, S):
    p = pool(x) (B, F); s = act(W p + b) with W (S, F) when sentence_dense.size = S, else s = p;
    then s / ||s|| when normalize_embeddings, and s[:, :K] with truncate_dim = K; with normalize_embeddings
    also sentence_embedding_unnormalized s[:, :K] (B, S), the vector before the normalization (last
    in the dict, as contract.output_names). With classifier.labels = L,
    logits = W_o h + b_o with h = norm(act(W_h v + b_h)) (the Dense when classifier.dense is set, the norm
    when classifier.norm), per token v = x_i (B, N, L), per sequence v = pool(x, classifier.pooling) (B, L)
    (over kept tokens whose id is not classifier.pad_id, when set).
    With token_dense.size = D, token_embeddings t_i = (W_t x_i + b_t) / ||W_t x_i + b_t|| (B, N, D);
    with token_weights, sparse w_i = relu(u . x_i + c) (B, N), on every position.
    SPLADE (pooling splade_max / splade_sum) pools a per-token head over the vocabulary (an MLM
    head, L = V) into sentence_embedding (B, V): see splade_pool.

    Embeddings, E = embedding_size or F:
      e = tokens + types + positions                       (B, N, E)
      (tokens after ESM's token dropout when token_dropout_id is set: see token_dropout)
      e = norm(e) when post-norm; embed_norm(e) when embedding_norm (pre-norm; the first block's
      norm1 is then skipped unless first_block_norm)
      x = project(e) when embedding_size is set (E -> F, ELECTRA), else e
    With convolution, after the first block x = norm(x + act(conv(e))) (DeBERTa-v2 xlarge).
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.config = cfg
        width = cfg.embedding_size or cfg.hidden_size
        self.tokens = nn.Embedding(cfg.vocab_size, width) if cfg.takes_ids else None
        self.types = nn.Embedding(cfg.type_vocab_size, width) if cfg.type_vocab_size else None
        self.positions = Positions(cfg, width)
        # post-norm normalises the embeddings (as BERT); pre-norm normalises the final output
        self.norm = make_norm(cfg, width if cfg.norm_position == "post" else cfg.hidden_size)
        # pre-norm models that also normalise their embeddings (ModernBERT)
        self.embed_norm = make_norm(cfg, width) if cfg.embedding_norm else None
        self.project = nn.Linear(width, cfg.hidden_size, bias=cfg.bias) if cfg.embedding_size else None
        self.blocks = nn.ModuleList(Block(cfg, first=i == 0, index=i) for i in range(cfg.num_layers))
        # per-task adapters (adapters.py): the blocks' Linears and the token table's part
        self.adapted = adapt_blocks(self.blocks, cfg) if cfg.adapters else []
        self.token_adapters = TokenAdapters(cfg, width) if cfg.adapters and cfg.adapters.token_adapters else None
        # one (buckets, H) table for all layers (MPNet), or ALiBi's slopes; the bias is computed once per call
        self.relative = (RelativePositionBias(cfg) if cfg.relative_attention
                         else AlibiBias(cfg) if cfg.positions == "alibi" else None)
        self.rotary = Rotary(cfg.head_size, cfg.rotary_theta, cfg.rotary_scale) if cfg.positions == "rotary" else None
        # local (sliding-window) layers: l % global_every != global_offset; they may rotate with their own theta
        self.local_layers = [l for l in range(cfg.num_layers) if not cfg.is_global(l)]
        local_theta = cfg.local_attention.rotary_theta if cfg.local_attention else 0.0
        self.rotary_local = Rotary(cfg.head_size, local_theta, cfg.rotary_scale) if local_theta else None
        # DeBERTa's relative table, normed once per call and projected by every layer
        self.disentangled = DisentangledPositions(cfg) if cfg.disentangled else None
        # DeBERTa-v2's convolution after the first layer, over the (masked) embeddings
        conv = cfg.convolution
        k = conv.kernel_size if conv else 0
        self.conv = nn.Conv1d(cfg.hidden_size, cfg.hidden_size, k, padding=(k - 1) // 2, groups=conv.groups) if conv else None
        self.conv_activation = make_activation(conv.activation if conv else "tanh")
        self.conv_norm = make_norm(cfg) if conv else None
        dense = cfg.sentence_dense
        self.sentence_dense = nn.Linear(cfg.hidden_size, dense.size, bias=dense.bias) if dense else None
        self.sentence_activation = make_activation(dense.activation if dense else "identity")
        head = cfg.classifier
        hidden = head.dense if head else "none"
        self.classifier_dense = nn.Linear(cfg.hidden_size, cfg.hidden_size) if hidden != "none" else None
        self.classifier_activation = make_activation("identity" if hidden == "none" else hidden)
        self.classifier_norm = make_norm(cfg) if head and head.norm else None
        self.classifier = nn.Linear(cfg.hidden_size, head.labels) if head else None
        token = cfg.token_dense
        self.token_dense = nn.Linear(cfg.hidden_size, token.size, bias=token.bias) if token else None
        self.token_weight = nn.Linear(cfg.hidden_size, 1) if cfg.token_weights else None

    def forward(self, inputs, attention_mask, token_type_ids=None, task_id=None):
        """task_id (B,) int64 with adapters (the default task's when None); a model with adapters and
        no token types takes it third, in contract.input_names' order."""
        cfg = self.config
        if not cfg.adapters:
            return self.encode(inputs, attention_mask, token_type_ids)
        if not cfg.type_vocab_size and task_id is None:
            token_type_ids, task_id = None, token_type_ids
        if task_id is None:
            task_id = torch.full(inputs.shape[:1], cfg.adapters.tasks.index(cfg.adapters.default), device=inputs.device)
        for layer in self.adapted:
            layer.task = task_id
        try:
            return self.encode(inputs, attention_mask, token_type_ids, task_id)
        finally:
            for layer in self.adapted:
                layer.task = None

    def encode(self, inputs, attention_mask, token_type_ids=None, task_id=None):
        cfg = self.config
        x = self.tokens(inputs) if self.tokens is not None else inputs  # (B, N, E)
        if self.token_adapters is not None:
            x = x + self.token_adapters(inputs, task_id)
        if cfg.token_dropout_id >= 0:
            x = token_dropout(x, inputs == cfg.token_dropout_id, attention_mask)
        if self.types is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(inputs)
            x = x + self.types(types)
        x = self.positions(x, attention_mask)
        if cfg.norm_position == "post":
            x = self.norm(x)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        if self.project is not None:
            x = self.project(x)  # (B, N, F)
        key_mask = attention_mask != 0  # (B, N) bool
        n = x.shape[1]
        relative = self.relative(n, x.device).to(x.dtype) if self.relative is not None else None  # (1, H, N, N)
        rotary = self.rotary(n, x.device) if self.rotary is not None else None  # cos, sin: each (N, D)
        local_bias, local_rotary = relative, rotary
        disentangled = self.disentangled(n) if self.disentangled is not None else None  # R (2S, F), I (N, N)
        if self.local_layers:  # every bias and table once per call, shared by the layers of its kind
            window = window_bias(n, cfg.local_attention.window, x)  # (1, 1, N, N)
            # masked_fill, not add: lowest + a negative bias would overflow to -inf in float16
            local_bias = window if relative is None else relative.masked_fill(window < 0, torch.finfo(x.dtype).min)
            local_rotary = self.rotary_local(n, x.device) if self.rotary_local is not None else rotary
        embedded = x  # (B, N, F), the convolution's input
        for l, block in enumerate(self.blocks):
            if l in self.local_layers:
                x = block(x, key_mask, local_bias, local_rotary)
            else:
                x = block(x, key_mask, relative, rotary, disentangled)
            if l == 0 and self.conv is not None:
                x = self.convolve(x, embedded, key_mask)
        if cfg.norm_position == "pre":
            x = self.norm(x)
        outputs = {"last_hidden_state": x}
        pad_id = cfg.classifier.pad_id if cfg.classifier else -1
        head_mask = key_mask if pad_id < 0 else not_pad_mask(key_mask, inputs, pad_id)
        logits = self.classify(x, head_mask) if self.classifier is not None else None
        if cfg.sparse:
            pooled = splade_pool(logits, key_mask, cfg.pooling, cfg.splade_activation)  # (B, V)
        elif cfg.pooling != "none":
            pooled = pool(x, key_mask, cfg.pooling)  # (B, F)
            if self.sentence_dense is not None:
                pooled = self.sentence_activation(self.sentence_dense(pooled))  # (B, S)
        unnormalized = None
        if cfg.pooling != "none":
            if cfg.normalize_embeddings:
                unnormalized = pooled[:, :cfg.truncate_dim] if cfg.truncate_dim else pooled
                pooled = normalized(pooled)
            # Matryoshka truncation after the normalisation, as sentence-transformers' truncate_dim
            outputs["sentence_embedding"] = pooled[:, :cfg.truncate_dim] if cfg.truncate_dim else pooled
        if logits is not None:
            outputs["logits"] = logits
        # per-token heads read every position, padded ones too: a ColBERT query keeps the outputs of
        # [MASK] expansion tokens that the attention mask hides from the other tokens
        if self.token_dense is not None:
            outputs["token_embeddings"] = normalized(self.token_dense(x))  # (B, N, D)
        if self.token_weight is not None:
            outputs["sparse"] = torch.relu(self.token_weight(x)).squeeze(-1)  # (B, N)
        if unnormalized is not None:  # last: contract.output_names' order, the optional output after the others
            outputs["sentence_embedding_unnormalized"] = unnormalized  # (B, S)
        return outputs

    def convolve(self, x: torch.Tensor, embedded: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """norm(x + act(m * conv(m * e))) (B, N, F): padding reads as zeros on both sides, so a
        token's result does not depend on the padding around it."""
        keep = key_mask[:, :, None].to(x.dtype)  # (B, N, 1)
        c = self.conv((embedded * keep).transpose(1, 2)).transpose(1, 2) * keep  # (B, N, F)
        return self.conv_norm(x + self.conv_activation(c))

    def classify(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """logits (B, N, L) per token or (B, L) per sequence from x (B, N, F)."""
        head = self.config.classifier
        h = x if head.per_token else pool(x, key_mask, head.pooling)
        if self.classifier_dense is not None:
            h = self.classifier_activation(self.classifier_dense(h))
        if self.classifier_norm is not None:
            h = self.classifier_norm(h)
        return self.classifier(h)


# the share of tokens ESM replaced by <mask> in training (15% chosen, 80% of those masked)
ESM_MASKED_SHARE = 0.15 * 0.8


def token_dropout(x: torch.Tensor, masked: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """ESM's token dropout at inference: e_i = 0 where masked, and every row scaled by
    (1 - 0.12) / (1 - r), r = masked kept tokens / kept tokens of its sequence.
    x (B, N, E), masked and attention_mask (B, N). A sequence whose kept tokens are all masked
    has only zero rows, so its scale is taken as 1 (transformers would divide by zero)."""
    keep = attention_mask != 0
    share = (masked & keep).sum(1).to(x.dtype) / keep.sum(1).clamp(min=1).to(x.dtype)  # (B,)
    scale = (1 - ESM_MASKED_SHARE) / torch.where(share < 1, 1 - share, torch.ones_like(share))
    return x.masked_fill(masked[..., None], 0.0) * scale[:, None, None]


def not_pad_mask(key_mask: torch.Tensor, ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, N) the kept tokens whose id is not ``pad_id``, which a decoder's score head reads the last
    of; a row whose kept tokens are all the pad id (an empty text whose eos is the pad id) keeps its
    first kept token, the one transformers scores then (index 0 under right padding)."""
    not_pad = key_mask & (ids != pad_id)
    first = torch.arange(key_mask.shape[1], device=ids.device)[None, :] == key_mask.to(torch.int64).argmax(dim=1)[:, None]
    # boolean ops, not Where: onnxruntime has no Where kernel for bool tensors
    return not_pad | (first & key_mask & ~not_pad.any(dim=1, keepdim=True))


def pool(x: torch.Tensor, key_mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Sentence embedding (B, F) from x (B, N, F) and key_mask (B, N), m = key_mask:
    mean: sum_i m_i x_i / max(sum_i m_i, 1); cls: x_j for the first j with m_j = 1 (x_0 under
    right padding, and under left padding the real first token, never a pad row); last: x_j
    for the last j with m_j = 1; max: max_i over kept tokens per feature; mean_sqrt_len:
    sum_i m_i x_i / sqrt(max(sum_i m_i, 1)); weighted_mean: mean with weights w_i = m_i (i - f + 1),
    f the first kept index (so left padding shifts nothing), sum_i w_i x_i / max(sum_i w_i, 1).
    Rows with nothing kept give x_0 for cls and zeros for the others."""
    if kind == "cls":
        index = key_mask.to(torch.int64).argmax(dim=1)  # (B,) the first kept index; 0 when none
        pooled = torch.gather(x, 1, index[:, None, None].expand(-1, 1, x.shape[2])).squeeze(1)
    elif kind == "last":
        n = x.shape[1]
        # the largest kept index: argmax of m_j * (j + 1); 0 for a row with nothing kept
        order = torch.arange(1, n + 1, device=x.device)[None, :] * key_mask.to(torch.int64)  # (B, N)
        index = order.argmax(dim=1)  # (B,)
        pooled = torch.gather(x, 1, index[:, None, None].expand(-1, 1, x.shape[2])).squeeze(1)
        pooled = pooled * key_mask.any(dim=1).to(x.dtype)[:, None]
    elif kind == "max":
        masked = x.masked_fill(~key_mask[:, :, None], torch.finfo(x.dtype).min)
        pooled = masked.max(dim=1).values * key_mask.any(dim=1).to(x.dtype)[:, None]
    else:
        weights = key_mask.to(torch.float32)  # (B, N)
        if kind == "weighted_mean":
            first = key_mask.to(torch.int64).argmax(dim=1, keepdim=True)  # (B, 1)
            place = torch.arange(1, x.shape[1] + 1, device=x.device)[None, :] - first  # (B, N)
            weights = weights * place.to(torch.float32)
        total = (x.float() * weights[:, :, None]).sum(dim=1)  # (B, F)
        count = weights.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
        pooled = (total / (count.sqrt() if kind == "mean_sqrt_len" else count)).to(x.dtype)
    return pooled


def splade_pool(logits: torch.Tensor, key_mask: torch.Tensor, kind: str, activation: str) -> torch.Tensor:
    """SPLADE's vocabulary weights (B, V) from a per-token head's logits (B, N, V):
    w_iv = log1p(relu(l_iv)) (log1p_relu: log1p of that again), zero for padded tokens, then
    s_v = max_i w_iv (splade_max) or sum_i w_iv (splade_sum). w >= 0, so a row with nothing
    kept is zeros either way."""
    weights = torch.log1p(torch.relu(logits.float()))
    if activation == "log1p_relu":
        weights = torch.log1p(weights)
    weights = weights * key_mask[:, :, None].to(weights.dtype)  # (B, N, V)
    pooled = weights.amax(dim=1) if kind == "splade_max" else weights.sum(dim=1)
    return pooled.to(logits.dtype)


def normalized(pooled: torch.Tensor) -> torch.Tensor:
    """pooled / max(||pooled||, 1e-12) over the last axis: per row (B, S), per token (B, N, D)."""
    # in float32: F.normalize's eps (1e-12) is 0 in float16, so a row with nothing kept would be 0 / 0
    return F.normalize(pooled.float(), dim=-1).to(pooled.dtype)


def build_encoder(cfg: EncoderConfig, seed: int | None = 0) -> Encoder:
    """An Encoder in eval mode; with a seed its random weights are reproducible."""
    if seed is None:
        model = Encoder(cfg)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Encoder(cfg)
    return model.eval()
