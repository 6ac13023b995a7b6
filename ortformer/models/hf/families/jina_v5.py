"""Import jina-embeddings-v5-text as released (``model_type: jina_embeddings_v5``, ``task_names`` in
config.json): a Llama-layer backbone with one PEFT LoRA adapter per task, every adapter kept (the
``adapters`` group, models/adapters.py) and chosen per row by the ``task_id`` input.

What the released folders hold (the sources are named in docs/families.md):
- config.json: the backbone's config with model_type ``jina_embeddings_v5`` and ``task_names``
  (retrieval, text-matching, clustering, classification). v5-text-small's config class subclasses
  transformers' Qwen3Config unchanged (Qwen3-0.6B-Base: causal attention, per-head q / k norms);
  v5-text-nano's subclasses EuroBertConfig (EuroBERT-210m: bidirectional). The two are told
  apart by the keys Qwen3Config always saves (use_sliding_window, max_window_layers), which
  EuroBertConfig has not.
- model.safetensors: the backbone's weights (Qwen3Model / EuroBertModel names, llama.py maps them).
- adapters/<task>/adapter_config.json and adapter_model.safetensors, one per task, as PEFT saves a
  LoRA adapter: r, lora_alpha, target_modules q/k/v/o_proj and gate/up/down_proj, tensors
  ``base_model.model.layers.{i}.<module>.lora_A.weight`` (r, in) and ``.lora_B.weight`` (out, r).
  Task t computes W + s_t B_t A_t on each target, s_t = lora_alpha / r (vLLM's
  JinaEmbeddingsV5Model merges exactly this for one task at load).
- config_sentence_transformers.json: the prompts "query" ("Query: ") and "document"
  ("Document: "), default "document"; modules.json names only the remote code's
  ``custom_st.Transformer``, which pools the last token (the mask's last kept one) and
  l2-normalises: the import's default pooling and normalisation.

The default task is ``retrieval``: the remote code builds its PEFT model with the retrieval adapter
active (modeling_jina_embeddings_v5.py's from_pretrained) and vLLM's JinaEmbeddingsV5Model loads
retrieval when no jina_task is given; a folder whose task_names lack it defaults to its first task.

q, k and v (and gate and up) are fused in the Encoder, so their adapters are kept per projection
(Adapters.per_projection): qkv's A stacks the three (3 r rows), its B keeps each projection's
rows. Tasks of different ranks are padded to the largest (zero rows of A, zero columns of B) and
tasks of different scales have s_t / s folded into B, s the first task's: both exact.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ....config import Adapters, EncoderConfig
from ....core.checks import brief
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, read_safetensors, weights_source
from ..config_checks import make_group
from ..family import Family
from ..folder_files import FolderFiles
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES, read_json, remote_transformer
from . import llama

WHAT = "Jina v5 (LoRA) "
DEFAULT_TASK = "retrieval"
ADAPTERS_DIR = "adapters"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# the Encoder's Linears under blocks.{i}. and the PEFT target modules under layers.{i}. they fuse, in row order
FUSED = {"attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "attention.out": ("self_attn.o_proj",), "ffn.up": ("mlp.gate_proj", "mlp.up_proj"),
         "ffn.down": ("mlp.down_proj",)}
# adapter_config.json settings that change what W + (alpha / r) B A computes: refused unless as here
PLAIN_LORA = {"peft_type": ("LORA",), "use_dora": (False, None), "use_rslora": (False, None),
              "fan_in_fan_out": (False, None), "bias": ("none", None), "modules_to_save": (None, []),
              "rank_pattern": ({}, None), "alpha_pattern": ({}, None), "layers_to_transform": (None,),
              "layer_replication": (None,)}
# config.json keys transformers' Qwen3Config always saves and EuroBertConfig never has
QWEN3_KEYS = ("use_sliding_window", "max_window_layers")


@dataclasses.dataclass(frozen=True)
class TaskAdapter:
    """One task's adapter as PEFT saved it: rank, scale = lora_alpha / r, and module -> (A (r, in), B (out, r))."""
    rank: int
    scale: float
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    file: Path


def backbone(hf: dict) -> str:
    """The transformers model_type the folder's layers are: "qwen3" (v5-text-small) or "eurobert" (nano)."""
    return "qwen3" if any(key in hf for key in QWEN3_KEYS) else "eurobert"


def task_names(hf: dict) -> list[str]:
    """config.json's task_names, each a plain folder name under adapters/ (never a path out of it)."""
    tasks = hf.get("task_names")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t for t in tasks) \
            or len(set(tasks)) != len(tasks):
        raise CheckpointError(f"{WHAT}config.json task_names={brief(tasks, 120)} must list the task names, each once")
    bad = [t for t in tasks if t in (".", "..") or "/" in t or "\\" in t]
    if bad:
        raise CheckpointError(f"{WHAT}config.json task_names {bad} are not folder names under {ADAPTERS_DIR}/; each "
                              "task's adapter lies in adapters/<task>/")
    return tasks


def read_adapter(folder: Path, task: str) -> TaskAdapter:
    """adapters/<task>/'s PEFT LoRA adapter, refused where it is not the plain W + (alpha / r) B A."""
    place = folder / ADAPTERS_DIR / task
    config_path, weights_path = place / ADAPTER_CONFIG, place / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise CheckpointError(f"{WHAT}task {task!r} has no adapter: {place} must hold {ADAPTER_CONFIG} and "
                              f"{ADAPTER_WEIGHTS} (a PEFT LoRA adapter saved with safetensors)")
    config = read_json(config_path)
    odd = [f"{key}={config.get(key)!r}" for key, allowed in PLAIN_LORA.items()
           if config.get(key, allowed[0]) not in allowed]
    if odd:
        raise CheckpointError(f"{config_path}: {', '.join(odd)} is not supported; ortformer imports plain LoRA "
                              "(peft_type LORA, no DoRA / rsLoRA, one rank and alpha for every module, no biases)")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1 or isinstance(alpha, bool) \
            or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise CheckpointError(f"{config_path}: r={rank!r}, lora_alpha={alpha!r}; the rank must be an int >= 1 and "
                              "alpha a number > 0")
    raw, _, _ = read_safetensors(weights_path)
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in raw.items():
        stem = name.removeprefix(PEFT_PREFIX).removeprefix("model.")
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if stem.endswith(suffix):
                if tensor.dtype not in HF_DTYPES or tensor.ndim != 2:
                    raise CheckpointError(f"{weights_path}: {name} is {tensor.dtype} {tuple(tensor.shape)}; a LoRA "
                                          "factor is a float matrix")
                factors.setdefault(stem[: -len(suffix)], {})[part] = tensor
                break
        else:
            raise CheckpointError(f"{weights_path} holds {name}, which is not a LoRA factor (<module>.lora_A.weight "
                                  "or .lora_B.weight)")
    pairs = {}
    for module, both in factors.items():
        if set(both) != {"lora_A", "lora_B"}:
            raise CheckpointError(f"{weights_path}: {module} has {sorted(both)} without its other LoRA factor")
        pairs[module] = (both["lora_A"], both["lora_B"])
    return TaskAdapter(rank, alpha / rank, pairs, weights_path)


def adapters_group(tasks: list[str], adapters: dict[str, TaskAdapter]) -> Adapters:
    """The adapters group: the largest rank, the first task's scale (the others fold theirs into B)."""
    default = DEFAULT_TASK if DEFAULT_TASK in tasks else tasks[0]
    rank = max(a.rank for a in adapters.values())
    return make_group(WHAT.strip(), Adapters, tasks=tuple(tasks), rank=rank, scale=adapters[tasks[0]].scale,
                      default=default, token_adapters=False, per_projection=True)


def adapter_tensors(cfg: EncoderConfig, adapters: dict[str, TaskAdapter], what: str) -> Tensors:
    """blocks.{i}.<Linear>.lora_a (T, P r, in) and .lora_b (T, out, r) of every adapted Linear:
    projection p's A at rows p r .. p r + r_t, its B at its own output rows; zeros where a task
    has no adapter for a module (PEFT's target_modules left it out) or a smaller rank."""
    group = cfg.adapters
    t, r = len(group.tasks), group.rank
    shapes = llama.linear_shapes(cfg, frozenset())
    out: Tensors = {}
    for i in range(cfg.num_layers):
        for ours, members in FUSED.items():
            width = sum(shapes[f"layers.{i}.{saved}.weight"][0] for saved in members)
            in_cols = shapes[f"layers.{i}.{members[0]}.weight"][1]
            out[f"blocks.{i}.{ours}.lora_a"] = torch.zeros(t, len(members) * r, in_cols)
            out[f"blocks.{i}.{ours}.lora_b"] = torch.zeros(t, width, r)
    for k, task in enumerate(group.tasks):
        adapter = adapters[task]
        factors = dict(adapter.factors)
        ratio = adapter.scale / group.scale  # folded into B: s_t B A = s (ratio B) A
        for i in range(cfg.num_layers):
            for ours, members in FUSED.items():
                row = 0  # projection p's first output row in the fused Linear
                for p, saved in enumerate(members):
                    rows, cols = shapes[f"layers.{i}.{saved}.weight"]
                    pair = factors.pop(f"layers.{i}.{saved}", None)
                    if pair is not None:
                        a, b = pair
                        if tuple(a.shape) != (adapter.rank, cols) or tuple(b.shape) != (rows, adapter.rank):
                            raise CheckpointError(
                                f"{adapter.file}: layers.{i}.{saved}'s LoRA factors are {tuple(a.shape)} and "
                                f"{tuple(b.shape)}, expected ({adapter.rank}, {cols}) and ({rows}, {adapter.rank})")
                        out[f"blocks.{i}.{ours}.lora_a"][k, p * r:p * r + adapter.rank] = a.float()
                        out[f"blocks.{i}.{ours}.lora_b"][k, row:row + rows, :adapter.rank] = b.float() * ratio
                    row += rows
        if factors:
            raise CheckpointError(f"{adapter.file}: adapters of {', '.join(sorted(factors)[:5])} have no place in "
                                  f"the {cfg.num_layers}-layer {what} (ortformer adapts layers.<i>.self_attn's "
                                  "q/k/v/o_proj and mlp's gate/up/down_proj)")
    return out


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a jina-embeddings-v5-text folder (its task adapters kept) as an ortformer Encoder."""
    files = FolderFiles.of(folder)
    hf = files.config
    tasks = task_names(hf)
    adapters = {task: read_adapter(files.model_dir, task) for task in tasks}
    native = {**hf, "model_type": backbone(hf)}
    family = llama.FAMILIES[native["model_type"]]
    biased = llama.biases(native, family.what, family.always_biased, family.bias_keys)

    def build(_: dict, common: dict) -> EncoderConfig:
        return llama.llama_config(native, common).replace(adapters=adapters_group(tasks, adapters))

    def weights(raw, cfg, where, duplicates):
        mapped, dropped = llama.map_weights(raw, cfg, where, duplicates, biased, family.base)
        return {**mapped, **adapter_tensors(cfg, adapters, f"{family.what.strip()} backbone")}, dropped

    # modules.json names the remote code's custom_st.Transformer alone: it runs the model with a task's
    # adapter, pools the last token and l2-normalises, all of which this import does (below);
    # the prompts and text length come from the sentence-transformers configs beside it
    kept = [m for m in files.modules if not remote_transformer(m)]
    plain = files if kept == files.modules else FolderFiles(files.root, files.model_dir, hf, modules=kept)
    loaded = import_folder(plain, family="jina_embeddings_v5", build=build, map_weights=weights,
                           pooling=pooling or "last", normalize=True if normalize is None else normalize, name=name)
    files_read = [loaded.weights, *(adapters[t].file for t in tasks)]
    return dataclasses.replace(loaded, source=weights_source(*files_read))


FAMILY = Family("Jina v5 with task adapters", ("jina_embeddings_v5",), load)
