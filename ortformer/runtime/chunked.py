"""Run a linear-family model chunk by chunk: memory bounded by the chunk, time linear in N.

Two-pass mode (non-causal), for each layer l with hidden state X updated in place:
  1. T = sum_c T_c, with T_c = fk_c^T [v_c, 1] from the stats stage on chunk c, summed in
     float64 (efficient: the online-softmax combine below);
  2. X_c <- apply(X_c, T) for every chunk c.
efficient keeps a running per-feature max M: M' = max(M, m_c),
  T <- T exp(M - M') + T_c exp(m_c - M'), and reads context = T[..., :D] / T[..., D].
Step mode (causal): the step stage carries T per layer from chunk to chunk (an RNN).

Positions are offset by each chunk's start. Pooling (mean, cls) is taken over chunks
here. The stage graphs and the map from their weight inputs to the main graph's
initializers come from the model's metadata (contract.META_CHUNKED; checked by
modelfile/ before anything runs).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import contract
from ..core.errors import InputError, ProviderError
from .providers import CPU_EP, CUDA_EP, spin_within_runs


@dataclass(frozen=True)
class Payload:
    chunk_size: int
    mode: str  # "two-pass" or "step"
    graphs: dict[str, bytes]
    weights: dict[str, dict[str, tuple[str, bool]]]


def parse_payload(data: dict) -> Payload:
    """Decoded payload; the model-file reader has checked its structure."""
    graphs = {name: base64.b64decode(text, validate=True) for name, text in data["graphs"].items()}
    weights = {group: {name: (str(v[0]), bool(v[1])) for name, v in entries.items()}
               for group, entries in data["weights"].items()}
    return Payload(int(data["chunk_size"]), data["mode"], graphs, weights)


def _main_weights(path, payload: Payload) -> dict[str, np.ndarray]:
    """The main graph's initializers the stages read, by name (external data resolved)."""
    import onnx
    from onnx import numpy_helper

    wanted = {target for entries in payload.weights.values() for target, _ in entries.values()}
    model = onnx.load(str(path), format="protobuf", load_external_data=True)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in wanted}


def _session_options(threads: int | None) -> ort.SessionOptions:
    # unlike the whole-graph session, the CPU arena stays on: every chunk has the same
    # shape, so the arena is reused instead of paying page faults on fresh buffers
    options = spin_within_runs(ort.SessionOptions())
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


class ChunkedRunner:
    """The stage sessions of one model and the weights they are fed; thread-safe to run."""

    def __init__(self, model_file, payload: Payload, threads: int | None, chunk_size: int | None = None,
                 providers: list | None = None):
        """providers: the onnxruntime providers argument of the whole-graph session (default the
        CPU alone); a Runtime on CUDA runs its chunk stages on CUDA too, or refuses to run them."""
        self.config = model_file.config
        self.payload = payload
        self.chunk_size = chunk_size or payload.chunk_size
        options = _session_options(threads)
        wanted = providers or [CPU_EP]
        self.sessions = {name: ort.InferenceSession(blob, options, providers=wanted)
                         for name, blob in payload.graphs.items()}
        if wanted[0] != CPU_EP:  # never a silent CPU run of a model the caller put on the GPU
            for name, session in self.sessions.items():
                if session.get_providers()[0] != CUDA_EP:
                    raise ProviderError(f"the chunk stage {name!r} of {model_file.path} runs on "
                                        f"{session.get_providers()}, not CUDA; use provider='cpu' for long inputs")
        main = _main_weights(model_file.path, payload)
        self.weights = {}
        for group, entries in payload.weights.items():
            feed = {}
            for name, (target, transposed) in entries.items():
                array = main[target]
                feed[name] = np.ascontiguousarray(array.T if transposed else array, dtype=np.float32)
            self.weights[group] = feed

    def _stage(self, name: str, feeds: dict, group: str | None = None) -> list[np.ndarray]:
        session = self.sessions[name]
        weights = self.weights[group or name]
        wanted = {i.name for i in session.get_inputs()}
        full = {**{k: v for k, v in feeds.items() if k in wanted}, **{k: v for k, v in weights.items() if k in wanted}}
        return session.run(None, full)

    def spans(self, n: int) -> list[tuple[int, int]]:
        return [(s, min(s + self.chunk_size, n)) for s in range(0, n, self.chunk_size)]

    def run(self, feeds: dict[str, np.ndarray], out: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Validated feeds (B, N[, F]) -> the contract's outputs, last_hidden_state in `out`."""
        cfg = self.config
        main_name = contract.INPUT_IDS if cfg.takes_ids else contract.INPUTS_EMBEDS
        mask = feeds[contract.ATTENTION_MASK]
        b, n = mask.shape
        hidden = out if out is not None else np.empty((b, n, cfg.hidden_size), np.float32)
        spans = self.spans(n)

        def front(s, e):
            f = {main_name: np.ascontiguousarray(feeds[main_name][:, s:e])}
            if contract.TOKEN_TYPE_IDS in feeds:
                f[contract.TOKEN_TYPE_IDS] = np.ascontiguousarray(feeds[contract.TOKEN_TYPE_IDS][:, s:e])
            f["start"] = np.array(s, np.int64)
            return f

        if self.payload.mode == "step":
            states = self.initial_states(b)
            for s, e in spans:
                hidden[:, s:e], states = self.step({**front(s, e), contract.ATTENTION_MASK: mask[:, s:e]}, states)
        else:
            for s, e in spans:
                hidden[:, s:e] = self._stage("embed", front(s, e))[0]
            for layer in range(cfg.num_layers):
                total = self._layer_total(hidden, mask, spans, f"layer.{layer}")
                for s, e in spans:
                    hidden[:, s:e] = self._stage("apply", {"hidden": hidden[:, s:e], "total": total}, f"layer.{layer}")[0]
            if "final" in self.sessions:
                for s, e in spans:
                    hidden[:, s:e] = self._stage("final", {"hidden": hidden[:, s:e]})[0]
        for s, e in spans:  # never hand back NaN/inf (Runtime._check_finite, one chunk at a time)
            if not np.isfinite(hidden[:, s:e]).all():
                raise InputError("the model produced non-finite values in last_hidden_state for these inputs; "
                                 "nothing was returned")
        outputs = {contract.LAST_HIDDEN_STATE: hidden}
        if cfg.pooling != "none":
            pooled = self._pool(hidden, mask, spans)  # (B, F) float64
            if cfg.normalize_embeddings:
                outputs[contract.SENTENCE_EMBEDDING_UNNORMALIZED] = pooled.astype(np.float32)
                pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            outputs[contract.SENTENCE_EMBEDDING] = pooled.astype(np.float32)
        return outputs

    def _layer_total(self, hidden, mask, spans, group) -> np.ndarray:
        """The layer's whole-sequence sums, float64 across chunks, as the apply stage's input."""
        efficient = self.config.attention == "efficient"
        t = m = None
        for s, e in spans:
            got = self._stage("stats", {"hidden": hidden[:, s:e], contract.ATTENTION_MASK: mask[:, s:e]}, group)
            if not efficient:
                t = got[0].astype(np.float64) if t is None else t + got[0]
                continue
            m_c, t_c = got[0].astype(np.float64), got[1].astype(np.float64)
            if t is None:
                m, t = m_c, t_c
                continue
            m_new = np.maximum(m, m_c)
            t = t * np.exp(m - m_new)[..., None] + t_c * np.exp(m_c - m_new)[..., None]
            m = m_new
        if not efficient:
            return t.astype(np.float32)
        denominator = t[..., -1:]
        context = np.where(denominator > 0, t[..., :-1] / np.where(denominator > 0, denominator, 1.0), 0.0)
        return context.astype(np.float32)  # (B, H, D, D)

    def _pool(self, hidden, mask, spans) -> np.ndarray:
        cfg = self.config
        if cfg.pooling == "cls":  # the first kept token, as the encoder's pool()
            first = (mask != 0).argmax(axis=1)
            pooled = hidden[np.arange(hidden.shape[0]), first].astype(np.float64)
        else:  # mean over kept tokens, float64 sums
            total = np.zeros((hidden.shape[0], cfg.hidden_size))
            for s, e in spans:
                total += np.einsum("bnf,bn->bf", hidden[:, s:e], mask[:, s:e].astype(np.float32), dtype=np.float64)
            pooled = total / np.maximum(mask.sum(axis=1, dtype=np.float64), 1.0)[:, None]
        return pooled  # (B, F) float64, before any normalization

    # -- step mode (causal) --------------------------------------------------------------
    def initial_states(self, batch: int) -> list[np.ndarray]:
        session = self.sessions["step"]
        shapes = {i.name: i.shape for i in session.get_inputs()}
        return [np.zeros((batch, *shapes[f"state_in.{l}"][1:]), np.float32) for l in range(self.config.num_layers)]

    def step(self, feeds: dict[str, np.ndarray], states: list[np.ndarray]):
        """One chunk through the causal step stage: (hidden (B, C, F), states after it)."""
        state_feeds = {f"state_in.{l}": s for l, s in enumerate(states)}
        got = self._stage("step", {**feeds, **state_feeds})
        return got[0], got[1:]
