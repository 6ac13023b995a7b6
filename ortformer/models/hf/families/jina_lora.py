"""Import jina-embeddings-v3 as released: the remote code's XLM-RoBERTa with rotary positions
(``model_type: xlm-roberta``, ``lora_adaptations`` in config.json), whose every Linear and Embedding
carries one LoRA adapter per task as a torch parametrization, into one model that keeps them all
(the ``adapters`` group, models/adapters.py), chosen per row by the ``task_id`` input.

The saved names are those of transformers' Jina v3 layout (rotary_bert.py) under ``roberta.``, with
each adapted ``X.weight`` saved as ``X.parametrizations.weight.original`` beside
``X.parametrizations.weight.0.lora_A`` / ``lora_B``. The remote code's task t computes

    Linear:     W + s B_t A_t          A (T, r, in), B (T, out, r)
    Embedding:  E + s A_t B_t          A (T, V, r), B (T, r, F)

with s = lora_alpha / lora_rank. The adapters of the attention's Wqkv and out_proj and the MLP's fc1
and fc2 stay low-rank beside each Linear; the word embedding's stay beside the token table; the
token-type embedding's (one type, folded into the token table as rotary_bert.py does) becomes one
vector per task, s A_t[0] B_t. The pooler's are set aside with the pooler. Nothing is merged: the
file holds every task (the base weights once, plus r (in + out) per Linear and task).

The default is what the remote code computes without a task: every adapter off, the base weights
alone. Its ``encode(task=None)`` documents "If `task` is not provided, all LoRA adapters are
disabled, and the model reverts to its original, general-purpose weights", and the model card's
example says "you can choose not to pass a `task`, and no specific LoRA adapter will be used"
(jinaai/xlm-roberta-flash-implementation's modeling_lora.py; jinaai/jina-embeddings-v3's
README.md); its sentence-transformers module (custom_st.py) does the same unless loaded with a
``default_task``. That choice is kept as one more task, ``none`` (BASE_TASK), whose factors are
zero, so a request may also name it. ``task_instructions`` are the prompts the remote code prepends
for each task, recorded as the file's prompts under the task names when the folder's
sentence-transformers config has none.
"""
from __future__ import annotations

import dataclasses

import torch

from ....core.checks import brief
from ....config import Adapters, EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors
from ..config_checks import make_group, refuse
from ..family import Family
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import remote_transformer
from . import rotary_bert

WHAT = "Jina v3 (LoRA) "
# the remote code's task=None: no adapter (the base weights), the default (see above)
BASE_TASK = "none"
ORIGINAL, LORA_A, LORA_B = ".parametrizations.weight.original", ".parametrizations.weight.0.lora_A", ".parametrizations.weight.0.lora_B"
# the adapted Linears of layer i (saved name under encoder.layers.{i}.) and the Encoder's module
LINEARS = {"mixer.Wqkv": "attention.qkv", "mixer.out_proj": "attention.out", "mlp.fc1": "ffn.up", "mlp.fc2": "ffn.down"}


def detect(hf: dict) -> bool:
    return hf.get("model_type") == "xlm-roberta" and "lora_adaptations" in hf


def adapters(hf: dict) -> Adapters:
    tasks, rank, alpha = hf.get("lora_adaptations"), hf.get("lora_rank", 4), hf.get("lora_alpha", 1)
    if not isinstance(tasks, list) or not tasks:
        raise CheckpointError(f"{WHAT}config.json lora_adaptations={brief(tasks, 120)} must list the task names")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or isinstance(rank, bool) or not isinstance(rank, int) \
            or rank < 1:
        raise CheckpointError(f"{WHAT}config.json lora_rank={rank!r}, lora_alpha={alpha!r}: the rank must be an int >= 1 "
                              "and alpha a number")
    if BASE_TASK in tasks:
        raise CheckpointError(f"{WHAT}config.json lora_adaptations={brief(tasks, 120)} names a task {BASE_TASK!r}, the "
                              "name ortformer gives the base weights without an adapter (the remote code's task=None)")
    return make_group(WHAT.strip(), Adapters, tasks=(*tasks, BASE_TASK), rank=rank, scale=alpha / rank,
                      default=BASE_TASK)


def native_config(hf: dict) -> dict:
    """The remote code's config.json in transformers' Jina v3 keys."""
    refuse(hf, "position_embedding_type", ("rotary",), "absolute", WHAT)
    return {**hf, "model_type": "jina_embeddings_v3", "rope_theta": hf.get("rotary_emb_base", 10000.0)}


def build(hf: dict, common: dict) -> EncoderConfig:
    return rotary_bert.rotary_config(native_config(hf), common).replace(adapters=adapters(hf))


def split_lora(raw: Tensors) -> tuple[Tensors, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(the tensors with every X.parametrizations.weight.original named X.weight, X -> (lora_A, lora_B))."""
    plain, lora = {}, {}
    for name, tensor in raw.items():
        if name.endswith(ORIGINAL):
            plain[name[: -len(ORIGINAL)] + ".weight"] = tensor
        elif not name.endswith((LORA_A, LORA_B)):
            plain[name] = tensor
    for name in raw:
        if name.endswith(LORA_A):
            stem = name[: -len(LORA_A)]
            if stem + LORA_B not in raw:
                raise CheckpointError(f"{WHAT}weights hold {name} without its {stem + LORA_B}")
            lora[stem.removeprefix("roberta.")] = (raw[name], raw[stem + LORA_B])
    return plain, lora


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    plain, lora = split_lora(raw)
    types = 1
    mapped, dropped = rotary_bert.map_weights(rotary_bert.JINA, types, plain, cfg, what, duplicates)
    group = cfg.adapters
    t, r, f, s = len(group.tasks) - 1, group.rank, cfg.hidden_size, group.scale  # the saved tasks, BASE_TASK last

    def factors(stem: str, a_shape: tuple, b_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """The saved tasks' (A, B), then BASE_TASK's zeros."""
        if stem not in lora:
            raise CheckpointError(f"{what}: the adapters of {stem} are missing ({stem}{LORA_A}, {LORA_B[1:]})")
        a, b = lora.pop(stem)
        if tuple(a.shape) != a_shape or tuple(b.shape) != b_shape:
            raise CheckpointError(f"{what}: {stem}'s adapters are {tuple(a.shape)} and {tuple(b.shape)}, expected "
                                  f"{a_shape} and {b_shape} ({t} tasks of rank {r})")
        return (torch.cat([a.float(), torch.zeros(1, *a_shape[1:])]),
                torch.cat([b.float(), torch.zeros(1, *b_shape[1:])]))

    for i in range(cfg.num_layers):
        for saved, ours in LINEARS.items():
            out_rows, in_cols = mapped[f"blocks.{i}.{ours}.weight"].shape
            a, b = factors(f"encoder.layers.{i}.{saved}", (t, r, in_cols), (t, out_rows, r))
            mapped[f"blocks.{i}.{ours}.lora_a"], mapped[f"blocks.{i}.{ours}.lora_b"] = a, b
    a, b = factors("embeddings.word_embeddings", (t, cfg.vocab_size, r), (t, r, f))
    mapped["token_adapters.lora_a"], mapped["token_adapters.lora_b"] = a, b
    a, b = factors("embeddings.token_type_embeddings", (t, types, r), (t, r, f))
    mapped["token_adapters.shift"] = (a[:, 0, None, :] @ b)[:, 0] * s  # (T, F): the one type row's delta per task
    dropped += [f"roberta.{stem}{part}" for stem in lora for part in (LORA_A, LORA_B) if stem.startswith("pooler.")]
    left = sorted(stem for stem in lora if not stem.startswith("pooler."))
    if left:
        raise CheckpointError(f"{what}: adapters of {', '.join(left[:5])} have no place in the Jina v3 layout")
    return mapped, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a jina-embeddings-v3 folder (its task adapters kept) as an ortformer Encoder."""
    files = FolderFiles.of(folder)
    hf = files.config
    # the released folder's modules.json names the remote code's custom_st.Transformer (the model with a
    # task's adapter, which this import implements), then sentence-transformers' Pooling and Normalize
    modules = [{**m, "type": "sentence_transformers.models.Transformer"} if remote_transformer(m) else m
               for m in files.modules]
    plain = files if modules == files.modules else FolderFiles(files.root, files.model_dir, hf, modules=modules)
    loaded = import_folder(plain, family="jina_embeddings_v3", build=build, map_weights=map_weights,
                           pooling=pooling, normalize=normalize, name=name)
    instructions = hf.get("task_instructions") or {}
    if not loaded.prompts and isinstance(instructions, dict) and all(isinstance(v, str) for v in instructions.values()):
        loaded = dataclasses.replace(loaded, prompts={k: v for k, v in instructions.items() if k in hf["lora_adaptations"]})
    return loaded


FAMILY = Family("Jina v3 with task adapters", ("xlm-roberta",), load, detect=detect)
