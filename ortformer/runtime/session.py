"""Runtime: one validated onnxruntime session for an ortformer model.

Thread safety: onnxruntime's InferenceSession.run may be called from many threads
at once. Everything a Runtime stores is set in __init__ and never changed, but the chunk
runner, built once on first use under a lock (chunk_runner); the per-call objects (validated feeds, IO bindings) are locals, so one Runtime can be
shared by any number of threads.
"""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort

from .. import contract
from ..core.checks import check_int
from ..core.errors import InputError, MissingExtraError, ModelFileError, ProviderError
from ..modelfile.int8_kernels import NO_CUDA_KERNELS, open_session
from ..config.text import check_texts
from . import providers
from ..core.cpus import available_cpus
from .batching import PreparedBatch, length_batches, prepare
from ..modelfile.chunkfile import MAX_CHUNK_SIZE
from ..modelfile import read_model_file, tokenizer_path
from .chunked import ChunkedRunner, parse_payload
from .right_padding import run_aligned, sequence_outputs
from .openvino_session import OpenVINOSession, int8_refused
from .tuned import check_opened as check_tuned_file, resolve as resolve_tuned
from .optimize import optimized_for_cpu
from .validate import InputSpec, check_inputs, task_ids


# embed's CPU batches hold at most this many padded tokens per intra-op thread, so each
# thread's rows of the (B * N, F) activations stay cache-sized (measured: batching.py)
CPU_TOKENS_PER_THREAD = 256




class ProviderFallbackWarning(RuntimeWarning):
    """provider='cuda' with allow_fallback=True ran on the CPU instead."""


class TextUnavailableWarning(RuntimeWarning):
    """The model names a tokenizer that cannot be used (missing beside the model, outside its
    folder, not a tokenizer): the model opens for token ids, and embed_texts says why not."""


class Runtime:
    """Serve an ortformer ONNX model: `Runtime("model.onnx").run(input_ids=[[1, 2, 3]])`.

    provider: "cpu", "cuda", or "auto" (CUDA when it really loads, else CPU, silently);
    "openvino" runs the same file on the OpenVINO runtime's CPU plugin in float32
    (runtime/openvino_session.py; the `openvino` extra), never chosen by "auto".
    "cuda" that cannot load raises ProviderError, or with allow_fallback=True warns
    (ProviderFallbackWarning) and runs on CPU; `provider` then says "cpu".
    threads: intra-op threads (None = onnxruntime's default, one per core).
    session_options: your own onnxruntime.SessionOptions, used as given (threads still
    applied); by default memory stays bounded under varying shapes (providers.session_options).
    chunk_size: tokens per chunk for linear-family models exported with chunk stages: a
    longer sequence runs chunk by chunk (runtime/chunked.py), in memory bounded by the
    chunk; None = the size recorded at export.
    precision: None (the file's own) or "bfloat16", with provider="openvino" on a CPU with
    AVX512_BF16 or AMX (gate: parity.GATES["bfloat16"]); else ProviderError naming the flags.
    "tuned" opens what `ortformer tune --write` recorded for this CPU and thread count (an
    engine, a precision, the file or its int8 sibling: runtime/tuned.py, the choice in
    ``tuned``); ProviderError naming `ortformer tune` where it recorded none.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        provider: str = "auto",
        *,
        device_id: int = 0,
        threads: int | None = None,
        allow_fallback: bool = False,
        session_options: ort.SessionOptions | None = None,
        chunk_size: int | None = None,
        precision: str | None = None,
    ):
        providers.check_request(provider, device_id, threads)
        providers.check_precision(provider, precision)
        self.tuned: dict | None = None  # the record's choice, with provider="tuned"
        if provider == "tuned":
            tuned = resolve_tuned(path, threads or available_cpus())
            path, provider, threads, self.tuned = tuned.path, tuned.provider, tuned.threads, tuned.choice
            precision = "bfloat16" if tuned.precision == "bfloat16" else None  # int8: the file says it
            providers.check_precision(provider, precision)
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or not 1 <= chunk_size <= MAX_CHUNK_SIZE):
            raise InputError(f"chunk_size={chunk_size!r} must be an int in [1, {MAX_CHUNK_SIZE}], or None")
        # every file check happens here, before onnxruntime opens (and follows) anything
        self.model_file = read_model_file(path)
        if self.tuned is not None:
            check_tuned_file(self.model_file, self.tuned)
        self.path: Path = self.model_file.path
        self.config = self.model_file.config
        self.metadata: dict[str, str] = dict(self.model_file.metadata)
        self.parity: dict = self.model_file.parity
        self.source: str = self.model_file.source
        # int8 weights are made unsigned at session start where this CPU's u8 x s8 GEMM saturates
        self._int8: bool = contract.META_INT8 in self.metadata
        if provider == "openvino":
            self._openvino_runnable(session_options)
        if self._int8 and provider != "cpu":
            provider = self._int8_on_cpu(provider, allow_fallback)

        if session_options is not None and not isinstance(session_options, ort.SessionOptions):
            raise InputError(f"session_options must be an onnxruntime.SessionOptions, got "
                             f"{type(session_options).__name__}")
        options = session_options if session_options is not None else providers.session_options(threads)
        if session_options is not None and threads is not None:
            options.intra_op_num_threads = threads
        if session_options is None and provider == "cpu" and optimized_for_cpu(self.model_file):
            # rewritten offline by this onnxruntime (runtime/optimize.py): skip redoing it
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # 0 = onnxruntime's default (one thread per physical core); for embed's token
        # budget the cores this process may run on stand in for it (logical ones with SMT)
        self.threads: int = options.intra_op_num_threads or available_cpus()
        if provider == "openvino":
            self._session, cuda_error = OpenVINOSession(self.path, self.threads, precision or "float32"), None
        else:
            self._session, cuda_error = self._open(options, providers.provider_list(
                provider, device_id, key_lengths=self.model_file.right_padding))
        self.provider: str = providers.short_name(self._session)
        if provider in ("auto", "cuda") and self.provider != "cuda":
            providers.remember_cuda_failure(device_id)
        if provider == "cuda" and self.provider != "cuda":
            reason = cuda_error or providers.cuda_failure_reason(device_id)
            if not allow_fallback:
                raise ProviderError(
                    f"provider 'cuda' was requested but onnxruntime runs {self._session.get_providers()}: {reason}. "
                    "Use provider='cpu' or 'auto', or allow_fallback=True"
                )
            warnings.warn(f"CUDA is not usable ({reason}); running on CPU", ProviderFallbackWarning, stacklevel=2)
        self.device_id: int | None = device_id if self.provider == "cuda" else None

        self._sequence_outputs = sequence_outputs(self.config)  # what a right-aligned call puts back
        self.input_names: list[str] = [i.name for i in self._session.get_inputs()]
        self.output_names: list[str] = [o.name for o in self._session.get_outputs()]
        embeds = {s.name: s.dtype for s in self.model_file.inputs}.get(contract.INPUTS_EMBEDS, "float32")
        self._spec = InputSpec(self.config, tuple(self.input_names), np.dtype(embeds))
        self.text_problem: str | None = None  # why text input is unavailable, when the tokenizer is unusable
        self._tokenizer_file: Path | None = None
        self._text_encoder = self._load_text_encoder()
        chunked = self.model_file.chunked
        self._payload = parse_payload(chunked) if chunked else None
        # tokens per chunk; None when the model has no chunk stages (always the whole graph)
        self.chunk_size: int | None = (chunk_size or self._payload.chunk_size) if self._payload else None
        self._runner: ChunkedRunner | None = None  # made on first use: most calls never need it
        self._runner_lock = threading.Lock()
        self._threads_option = threads
        self._run_options = ort.RunOptions()
        if self.provider == "cuda":
            # give arena chunks no longer in use back to the device after each run: with
            # kSameAsRequested growth this bounds GPU memory by the largest live call
            self._run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", f"gpu:{device_id}")

    def _openvino_runnable(self, session_options) -> None:
        """Refuse, before anything opens, what the OpenVINO runtime cannot run."""
        if self._int8:
            raise int8_refused(self.path)
        if session_options is not None:
            raise ProviderError("session_options are onnxruntime's and do not apply to provider='openvino' "
                                "(it takes threads only); use provider='cpu' with session_options")

    def _int8_on_cpu(self, provider: str, allow_fallback: bool) -> str:
        """"cpu" for an int8 file: onnxruntime has CUDA kernels for neither MatMulIntegerToFloat
        nor the blocked QuantizeLinear that scales each row, so a CUDA session would fail at its
        first run. "auto" means the CPU; "cuda" is refused unless allow_fallback (then a warning)."""
        why = f"{self.path} is an int8 file, which runs on the CPU provider only ({NO_CUDA_KERNELS})"
        if provider == "cuda" and not allow_fallback:
            raise ProviderError(f"{why}; use provider='cpu' or 'auto', or export --dtype float16 for CUDA")
        if provider == "cuda":
            warnings.warn(f"{why}; running on CPU", ProviderFallbackWarning, stacklevel=3)
        return "cpu"

    def _open(self, options: ort.SessionOptions, wanted: list) -> tuple[ort.InferenceSession, str | None]:
        """A session for `wanted` providers; if CUDA makes creation itself fail (rather than
        being skipped), retry on CPU and return the CUDA error as the reason."""
        try:
            session = open_session(self.path, options, wanted, int8=self._int8)
        except Exception as exc:  # onnxruntime's exceptions share no base class but Exception
            first = exc
        else:
            if wanted != [providers.CPU_EP] and session.get_providers() == [providers.CPU_EP]:
                # onnxruntime skipped CUDA: open it as the CPU session it is, so that it runs the
                # CPU graph (int8_kernels.CPU_DISABLED_FUSIONS) and answers as provider="cpu" does
                session = open_session(self.path, options, [providers.CPU_EP], int8=self._int8)
            return session, None
        if wanted != [providers.CPU_EP]:
            try:
                session = open_session(self.path, options, [providers.CPU_EP], int8=self._int8)
            except Exception:
                pass
            else:
                return session, f"creating a CUDA session failed: {first}"
        raise ModelFileError(f"{self.path}: onnxruntime cannot load the model: {first}") from None

    def __repr__(self) -> str:
        return f"Runtime({str(self.path)!r}, provider={self.provider!r}, model={self.config.name!r})"

    @property
    def pools(self) -> bool:
        return contract.SENTENCE_EMBEDDING in self.output_names

    @property
    def main_input(self) -> str:
        """input_ids, or inputs_embeds for a float-feature model (vocab_size = 0)."""
        return self._spec.main

    def tokenizer_path(self) -> Path | None:
        """The tokenizer file named in the metadata, checked to lie in the model's folder;
        None when the model names none or names one that cannot be used (see ``text_problem``)."""
        return self._tokenizer_file

    def _load_text_encoder(self):
        """The tokenizer named in the metadata, or None (then embed_texts explains why).

        A model copied without its tokenizer, or with a broken one, still serves token ids:
        the problem is kept in ``text_problem``, warned about once, and raised by embed_texts."""
        try:
            path = tokenizer_path(self.model_file)
        except ModelFileError as exc:  # missing, outside the folder, hard-linked: never read
            return self._text_unavailable(str(exc))
        if path is None:
            return None
        from ..config.text import TextEncoder

        try:
            encoder = TextEncoder(path, self.text_lowercase)
        except MissingExtraError:
            encoder = None  # the model still serves token ids; embed_texts raises the extra's name
        except ModelFileError as exc:
            return self._text_unavailable(str(exc))
        self._tokenizer_file = path
        return encoder

    def _text_unavailable(self, reason: str) -> None:
        self.text_problem = reason
        warnings.warn(f"text input is unavailable, token ids still work: {reason}", TextUnavailableWarning,
                      stacklevel=4)
        return None

    @property
    def text_max_length(self) -> int:
        """Default truncation for text: the metadata's text_max_length, else max_sequence."""
        return self.model_file.text_max_length

    @property
    def text_lowercase(self) -> bool:
        """True when texts are lowercased before tokenizing (sentence-transformers' do_lower_case)."""
        return self.model_file.text_lowercase

    @property
    def truncation_side(self) -> str | None:
        """Which end a long text loses, "right" (transformers' default) or "left" (the tokenizer
        file's truncation direction); None without a usable tokenizer."""
        return self._text_encoder.truncation_side if self._text_encoder is not None else None

    @property
    def labels(self) -> list[str]:
        """The classifier's label names by id, for the "logits" output ([] without a classifier)."""
        return self.model_file.labels

    @property
    def family(self) -> str | None:
        """The Hugging Face model_type the weights were imported from, if recorded."""
        return self.metadata.get(contract.META_FAMILY)

    @property
    def prompts(self) -> dict[str, str]:
        """sentence-transformers prompts recorded at export: name -> text prepended to each input."""
        return contract.parse_prompts(self.metadata[contract.META_PROMPTS])[0] if contract.META_PROMPTS in self.metadata else {}

    @property
    def default_prompt(self) -> str | None:
        """The prompt name embed_texts uses when none is given (None: no prompt)."""
        return contract.parse_prompts(self.metadata[contract.META_PROMPTS])[1] if contract.META_PROMPTS in self.metadata else None

    def embed_texts(self, texts: Sequence[str], batch_size: int = 32, output: str | None = None,
                    max_length: int | None = None, max_tokens: int | None = None, prompt_name: str | None = None,
                    pairs: Sequence[str] | None = None, kind: str | None = None, task: str | None = None):
        """Tokenize with the model's tokenizer, truncate (TruncationWarning), batch by length, run.

        Returns what ``embed`` returns, by default (``select_output``) a classifier's logits,
        else (n, S) sentence embeddings when the model pools (S = config.sentence_size; a SPLADE
        model's vocabulary weights).
        max_length defaults to ``text_max_length``. prompt_name: one of ``prompts``, whose
        text is prepended to every input as sentence-transformers does; None uses
        ``default_prompt`` (if any), "" uses no prompt. pairs: a second text for each text,
        joined by the tokenizer's pair template with its token types (a cross-encoder's
        query and passage: ``output="logits"`` then scores each pair).
        kind: "query" or "document" for a late-interaction model (ColBERT, bge-m3): a list of
        (n_kept, D) float32 unit vectors per text, with the file's markers, query expansion and
        skiplist (runtime/late.py), max_length (marker included) replacing the file's query / document
        length; output="sparse": a {token id: weight} dict per text.
        task: a model with task adapters (config.adapters) runs every text with this task's adapter
        (None: the file's default task); its prompt, when the model records one under the task's name
        and prompt_name is None, is prepended. prompt_name naming a task (and task None) picks both.
        """
        task, prompt_name = self.task_and_prompt(task, prompt_name)
        prefix = self.prompt_text(prompt_name)
        if prefix:
            texts = [prefix + text if isinstance(text, str) else text for text in texts]
        if kind is not None or output in (contract.TOKEN_EMBEDDINGS, contract.SPARSE):
            from .late import embed_late

            if pairs is not None:
                raise InputError("pairs join two texts for a cross-encoder; late interaction embeds each text "
                                 "alone (kind='query' or 'document')")
            if task is not None:
                raise InputError("task selects an adapter of an embedding model; late interaction runs without one")
            name = output or contract.TOKEN_EMBEDDINGS
            return embed_late(self, texts, kind or "document", [name], batch_size, max_tokens, max_length)[name]
        encoder = self._text_encoder_checked()
        length = self.text_max_length if max_length is None else max_length
        special = encoder.num_special_tokens if pairs is None else encoder.num_pair_special_tokens
        check_int("max_length", length, low=special + 1, high=self.config.max_sequence,
                  why=f" (the tokenizer adds {special} special tokens; max_sequence is the longest the model takes)")
        ids, types, _ = encoder.encode(texts, length, pairs)
        with_types = pairs is not None and contract.TOKEN_TYPE_IDS in self.input_names
        return self.embed(ids, batch_size=batch_size, output=output, max_tokens=max_tokens,
                          token_types=types if with_types else None, task=task)

    def task_and_prompt(self, task: str | None, prompt_name: str | None) -> tuple[str | None, str | None]:
        """(task, prompt_name) as embed_texts reads them (serve's routes too): a task's own prompt
        when prompt_name is None, a task taken from prompt_name when it names one and task is None
        (with that prompt where the model records one under the task's name, as jina-embeddings-v3
        does, else the default prompt: v5's prompts are query / document for every task).
        InputError for a task on a model without adapters; an unknown task is left to task_ids."""
        adapters = self.config.adapters
        if adapters is None:
            if task is not None:
                raise InputError(f"task={task!r} selects a task adapter; {self.path} has none")
            return None, prompt_name
        if task is None and prompt_name in adapters.tasks:
            return prompt_name, prompt_name if prompt_name in self.prompts else None
        if task is not None and prompt_name is None and task in self.prompts:
            return task, task
        return task, prompt_name

    def embed_all(self, texts: Sequence[str], kind: str = "document", batch_size: int = 32,
                  max_tokens: int | None = None, prompt_name: str | None = None,
                  max_length: int | None = None) -> dict[str, list]:
        """Every output of a late-interaction model for each text, from one run per batch (bge-m3's
        dense, sparse and ColBERT vectors): {"sentence_embedding": (n, S) float32 (when it pools),
        "token_embeddings": [(n_kept, D) float32], "sparse": [{token id: weight}] (when it has them)}."""
        from .late import embed_all

        prefix = self.prompt_text(prompt_name)
        texts = [prefix + t if isinstance(t, str) else t for t in texts] if prefix else texts
        return embed_all(self, texts, kind, batch_size, max_tokens, max_length)

    @staticmethod
    def maxsim(query, documents) -> np.ndarray:
        """ColBERT's MaxSim of one query's vectors (n_q, D) against each document's (n_d, D):
        sum over query vectors of the largest dot product with the document's, (n_docs,) float32."""
        from .late import maxsim

        return maxsim(query, documents)

    @property
    def rerank_template(self):
        """An LLM reranker's prompt template (rerank_template.RerankTemplate), or None."""
        return self.model_file.rerank

    def rerank_ids(self, query: str, documents: Sequence[str], instruction: str | None = None,
                   max_length: int | None = None) -> list[list[int]]:
        """An LLM reranker's input ids for each (query, document): the file's template with its slots
        filled, each segment tokenized alone, the document's segment cut so each holds at most
        max_length (default ``text_max_length``) ids."""
        template = self.rerank_template
        if template is None:
            raise InputError(f"{self.path} is not an LLM reranker (no '{contract.META_RERANK}' template); "
                             "score a cross-encoder with embed_texts(queries, pairs=documents)")
        query, *documents = check_texts([query, *documents])
        if instruction is not None and not isinstance(instruction, str):
            raise InputError(f"instruction must be a string or None, got {type(instruction).__name__}")
        length = self.text_max_length if max_length is None else max_length
        check_int("max_length", length, low=1, high=self.config.max_sequence)
        encoder = self._text_encoder_checked()
        try:
            return [template.ids(encoder.plain_ids, query, d, length, instruction) for d in documents]
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def rerank(self, query: str, documents: Sequence[str], instruction: str | None = None, batch_size: int = 32,
               max_length: int | None = None) -> np.ndarray:
        """An LLM reranker's score of each document for ``query`` (n,) float32, in the documents' order:
        score(d), d = z_yes - z_no the file's logits at each prompt's last token (the template's
        "sigmoid": P(yes) as Qwen3-Reranker's card computes it; "logit": d, mxbai-rerank-v2's).
        instruction: None uses the template's default instruction, "" none."""
        ids = self.rerank_ids(query, documents, instruction, max_length)
        d = self.embed(ids, batch_size=batch_size, output=contract.LOGITS)[:, 0]
        return np.asarray(self.rerank_template.scores(d), dtype=np.float32)

    @property
    def late(self):
        """How texts become late-interaction vectors (late.LateInteraction), or None."""
        return self.model_file.late

    def _text_encoder_checked(self):
        """The tokenizer, or the error saying why texts cannot be read."""
        if self._text_encoder is None:
            if self.text_problem is not None:
                raise ModelFileError(f"{self.path}: text input is unavailable: {self.text_problem}; copy the "
                                     "model's tokenizer beside it (or re-export it with one), or give token ids "
                                     "instead (embed() / run(), infer --ids)")
            if self.tokenizer_path() is None:
                raise InputError(f"{self.path} names no tokenizer ('{contract.META_TOKENIZER}' metadata); "
                                 "export it with a tokenizer (export --tokenizer FILE, or --from a folder that "
                                 "holds one), or give token ids instead (embed() / run(), infer --ids)")
            from ..config.text import TextEncoder

            TextEncoder(self.tokenizer_path())  # raises MissingExtraError naming the 'text' extra
        return self._text_encoder

    def prompt_text(self, name: str | None) -> str:
        """The text prepended for prompt `name` (None: default_prompt, "": none); InputError
        naming the valid prompts for another name."""
        name = self.default_prompt if name is None else name
        if name == "" or name is None:
            return ""
        prompts = self.prompts
        if name not in prompts:
            valid = ", ".join(repr(p) for p in sorted(prompts)) or "none (the model records no prompts)"
            raise InputError(f"prompt_name={name!r} is not a prompt of {self.path}; valid: {valid}, or '' for no prompt")
        return prompts[name]

    def run(self, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None, *,
            out: np.ndarray | None = None, task_id=None, **unknown) -> dict[str, np.ndarray]:
        """One forward pass over a rectangular batch.

        input_ids (B, N) ints, or inputs_embeds (B, N, F) floats for vocab_size = 0;
        attention_mask (B, N) in {0, 1}, default ones; token_type_ids (B, N), default zeros.
        numpy arrays or nested lists. Returns {"last_hidden_state": (B, N, F) float32,
        "sentence_embedding": (B, S) float32 (only when the model pools; S = config.sentence_size),
        "logits": (B, L) or per token (B, N, L) float32 (only with a classifier; L = config.num_labels)}.
        out: a writable float32 (B, N, F) array or numpy.memmap that receives
        last_hidden_state (and is returned as it); a chunked run writes it chunk by chunk.
        task_id (a model with task adapters): a task name or index for every row, or one per row;
        default the file's default task.
        A file exported with padding="right" (its attention takes key lengths) gets rows that are
        not right-padded right-aligned before the call, and its per-token outputs back in the
        given columns (runtime/right_padding.py).
        """
        if unknown:
            raise InputError(f"unknown input(s) {sorted(unknown)}; this model takes {self.input_names}")
        given = {
            contract.INPUT_IDS: input_ids, contract.INPUTS_EMBEDS: inputs_embeds,
            contract.ATTENTION_MASK: attention_mask, contract.TOKEN_TYPE_IDS: token_type_ids,
            contract.TASK_ID: task_id,
        }
        feeds = check_inputs(self._spec, given)
        if out is None:
            return self._execute(feeds)
        shape = (*feeds[contract.ATTENTION_MASK].shape, self.config.hidden_size)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape or not out.flags.writeable:
            got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}".strip()
            raise InputError(f"out must be a writable float32 numpy array (or memmap) of shape {shape}, got {got}")
        outputs = self._execute(feeds, out)
        if outputs[contract.LAST_HIDDEN_STATE] is not out:
            out[...] = outputs[contract.LAST_HIDDEN_STATE]
            outputs[contract.LAST_HIDDEN_STATE] = out
        return outputs

    def chunk_runner(self) -> ChunkedRunner | None:
        """The chunk-stage sessions (made on first use), or None for a model without them."""
        if self._payload is None:
            return None
        if self.provider == "openvino":
            # the chunk stages carry state between onnxruntime sessions (runtime/chunked.py)
            raise ProviderError(f"a sequence longer than chunk_size={self.chunk_size}, and stream(), run chunk by "
                                "chunk on onnxruntime sessions, which provider='openvino' does not; use "
                                f"provider='cpu', or inputs of at most {self.chunk_size} tokens")
        with self._runner_lock:
            if self._runner is None:
                stages = (providers.provider_list("cuda", self.device_id) if self.provider == "cuda"
                          else [providers.CPU_EP])
                self._runner = ChunkedRunner(self.model_file, self._payload, self._threads_option, self.chunk_size,
                                             stages)
        return self._runner

    def stream(self, chunks):
        """A causal linear-family model as an RNN: yield each chunk's last_hidden_state.

        chunks: token-id chunks (C,) (features (C, F) for vocab_size = 0) of any sizes, or
        (B, C[, F]) batches of rows streamed together. Concatenated, the outputs equal one
        causal run over the whole sequence; memory holds only each layer's state.
        """
        from .stream import stream

        return stream(self, chunks)

    def _execute(self, feeds: dict[str, np.ndarray], out: np.ndarray | None = None,
                 names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The model's outputs for validated feeds: all of them, or only `names` (embed asks for
        the one it returns, so onnxruntime hands back and we check no other)."""
        names = self.output_names if names is None else names
        rows, length = feeds[contract.ATTENTION_MASK].shape
        if contract.TASK_ID in self.input_names and contract.TASK_ID not in feeds:  # callers that name no task
            feeds = {**feeds, contract.TASK_ID: task_ids(self.config, None, rows)}
        if rows == 0:  # an empty batch: zero rows of each output, no session call
            shapes = contract.output_shapes(self.config)
            return {name: np.zeros([0, *(length if axis == contract.SEQUENCE_AXIS else axis for axis in shapes[name][1:])],
                                   np.float32) for name in names}
        if self.chunk_size is not None and feeds[contract.ATTENTION_MASK].shape[1] > self.chunk_size:
            return self.chunk_runner().run(feeds, out)
        if self.model_file.right_padding:  # key lengths hold for right-padded rows only: align, run, put back
            return run_aligned(lambda aligned: self._session_call(aligned, names), feeds, self._sequence_outputs)
        return self._session_call(feeds, names)

    def _session_call(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """One call of the session (IO binding on CUDA), its outputs checked finite."""
        if self.provider == "cuda":
            outputs = self._run_bound(feeds, "cuda", self.device_id, names)
        else:
            outputs = dict(zip(names, self._session.run(names, feeds, self._run_options)))
        self._check_finite(outputs, feeds)
        return outputs

    def _check_finite(self, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> None:
        """Never hand back NaN/inf: finite inputs of huge magnitude (|x| ~ 1e38 in float32) can
        overflow inside the model, and a model with non-finite weights gives NaN for any input."""
        for name, array in outputs.items():
            if np.isfinite(array).all():  # the common case, without counting
                continue
            bad = array.size - int(np.isfinite(array).sum())
            if bad:
                cause = ("inputs_embeds too large for float32 arithmetic (largest |x| = "
                         f"{float(np.abs(feeds[contract.INPUTS_EMBEDS]).max()):.3g}), "
                         if contract.INPUTS_EMBEDS in feeds else "")
                raise InputError(
                    f"the model produced {bad} non-finite value(s) in {name} for these inputs; possible causes: "
                    f"{cause}weights that hold NaN/inf, or activations that overflow (a float16 model beyond "
                    "65,504); nothing was returned"
                )

    def _run_bound(self, feeds: dict[str, np.ndarray], device: str, device_id: int,
                   names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Run with IO binding: inputs copied to `device` once, outputs allocated there by
        onnxruntime (no host staging inside run), then copied back. The binding is a
        local: it is mutable and must not be shared between threads."""
        binding = self._session.io_binding()
        values = [ort.OrtValue.ortvalue_from_numpy(array, device, device_id) for array in feeds.values()]
        for name, value in zip(feeds, values):
            binding.bind_ortvalue_input(name, value)
        names = self.output_names if names is None else names
        for name in names:
            binding.bind_output(name, device, device_id)
        self._session.run_with_iobinding(binding, self._run_options)
        return dict(zip(names, binding.copy_outputs_to_cpu()))

    def embed(self, sequences: Sequence[Any], batch_size: int = 32, output: str | None = None,
              max_tokens: int | None = None, token_types: Sequence[Any] | None = None,
              attention: Sequence[Any] | None = None, task=None):
        """Run many sequences of different lengths, batched by similar length.

        sequences: token-id lists (len_i,), or (len_i, F) float arrays for vocab_size = 0.
        A batch holds at most batch_size sequences and max_tokens padded tokens (batch x
        its longest); max_tokens defaults to CPU_TOKENS_PER_THREAD x threads on the CPU,
        and to no cap on CUDA, where bigger batches keep the device busy.
        output: "sentence_embedding" (default when the model pools) returns an (n, S)
        float32 array (S = config.sentence_size); "last_hidden_state" (default otherwise) returns a list of
        (len_i, F) arrays; "logits" (a classifier) an (n, L) array, or per token a list of (len_i, L).
        token_types: a (len_i,) type-id list per sequence (text pairs), for a model that takes
        token_type_ids; default zeros. attention: a (len_i,) 0/1 mask per sequence, default all ones
        (a ColBERT query's [MASK] expansion tokens are run but not attended to: runtime/late.py).
        Results are in the caller's order and equal unbatched runs.
        task: with task adapters, a task name or index for every sequence, or one per sequence
        (default: the file's default task).
        """
        name = self.select_output(output)
        return self.embed_outputs(sequences, [name], batch_size, max_tokens, token_types, attention, task)[name]

    def embed_outputs(self, sequences: Sequence[Any], outputs: Sequence[str], batch_size: int = 32,
                      max_tokens: int | None = None, token_types: Sequence[Any] | None = None,
                      attention: Sequence[Any] | None = None, task=None) -> dict[str, Any]:
        """embed for several outputs from one run per batch: {output: its result, as embed gives it}."""
        names = [self.select_output(name) for name in outputs]
        max_tokens = self._token_budget(batch_size, max_tokens)
        return self.embed_prepared(self.prepare(sequences, names, token_types=token_types, attention=attention,
                                                task=task), batch_size, max_tokens)

    def prepare(self, sequences: Sequence[Any], outputs: Sequence[str | None] = (None,), *,
                token_types: Sequence[Any] | None = None, attention: Sequence[Any] | None = None,
                task=None) -> PreparedBatch:
        """Validate sequences once (as embed takes them; InputError as embed raises) into a
        ``PreparedBatch`` for ``embed_prepared`` or ``run_prepared``, which check nothing again.
        outputs: output names, or one name (None: ``select_output``'s default); task: as embed's."""
        names = [self.select_output(name) for name in ([outputs] if isinstance(outputs, str) else outputs)]
        return prepare(self._spec, names, sequences, token_types, attention, task)

    def embed_prepared(self, batch: PreparedBatch, batch_size: int = 32,
                       max_tokens: int | None = None) -> dict[str, Any]:
        """Run a prepared batch sorted by length and cut by batch_size and max_tokens (as embed
        does): {output: (n, S) float32 for a pooled output, else a list of (len_i, ...) arrays},
        rows in the batch's order."""
        self._own(batch)
        max_tokens = self._token_budget(batch_size, max_tokens)
        results = self._empty_results(batch)
        lengths = batch.lengths
        for rows in length_batches(lengths, batch_size, max_tokens):
            self._fill(results, rows, batch.take(rows), lengths)
        return results

    def run_prepared(self, batch: PreparedBatch) -> dict[str, Any]:
        """Run a prepared batch as one model call, padded to its longest sequence, in the order
        given (no sorting, no budget: for a caller that cut its own batches); results as
        ``embed_prepared`` gives them."""
        self._own(batch)
        results = self._empty_results(batch)
        if len(batch):
            self._fill(results, np.arange(len(batch)), batch, batch.lengths)
        return results

    def _own(self, batch: PreparedBatch) -> None:
        """A batch prepared for this model's inputs: one prepared for another model was checked
        against other limits (vocabulary, lengths), so it is refused."""
        if not isinstance(batch, PreparedBatch):
            raise InputError(f"expected a PreparedBatch from Runtime.prepare(...), got {type(batch).__name__}")
        if (batch.spec is not self._spec and batch.spec != self._spec) or not set(batch.outputs) <= set(self.output_names):
            raise InputError(f"this batch was prepared for another model's inputs; prepare it with {self!r}.prepare")

    def _token_budget(self, batch_size: int, max_tokens: int | None) -> int | None:
        """max_tokens checked, or the default: CPU_TOKENS_PER_THREAD x threads on the CPU, no cap on CUDA."""
        check_int("batch_size", batch_size)
        if max_tokens is None and self.provider != "cuda":  # cpu and openvino: the CPU's budget
            return CPU_TOKENS_PER_THREAD * self.threads
        if max_tokens is not None:
            check_int("max_tokens", max_tokens, why=" (or None for the default)")
        return max_tokens

    def _empty_results(self, batch: PreparedBatch) -> dict[str, Any]:
        shapes = contract.output_shapes(self.config)
        return {name: np.empty((len(batch), shapes[name][-1]), np.float32) if self._pooled(name) else [None] * len(batch)
                for name in batch.outputs}

    def _pooled(self, name: str) -> bool:
        """Whether `name` has one vector per sequence (rather than one per token)."""
        return contract.output_shapes(self.config)[name][1] != contract.SEQUENCE_AXIS

    def _fill(self, results: dict[str, Any], rows: np.ndarray, part: PreparedBatch, lengths: np.ndarray) -> None:
        """Run `part` (the batch's `rows`) as one model call and write its rows into results."""
        names = list(part.outputs)
        out = self._execute(part.feeds(), names=names)
        for name in names:
            if self._pooled(name):
                results[name][rows] = out[name]
                continue
            for row, i in enumerate(rows):  # copy, so one result does not pin its whole batch
                results[name][i] = out[name][row, : lengths[i]].copy()

    def select_output(self, output: str | None) -> str:
        """`output` checked against the model's outputs; None picks the default: a
        classifier's logits, else the sentence embedding when the model pools (SPLADE's
        vocabulary weights for a sparse model), else last_hidden_state."""
        if output is None:
            if contract.LOGITS in self.output_names and not self.config.sparse:
                return contract.LOGITS
            return contract.SENTENCE_EMBEDDING if self.pools else contract.LAST_HIDDEN_STATE
        if output not in self.output_names:
            raise InputError(f"output {output!r} is not one of this model's outputs {self.output_names} "
                             f"(pooling={self.config.pooling!r}, classifier labels={self.config.num_labels})")
        return output
