"""Shared checks for the Hugging Face family imports: tiny random transformers models
saved with save_pretrained, compared with ortformer eager and the exported ONNX model
over the parity grid's shapes with right and left padding."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub: everything below is local
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from ortformer import contract  # noqa: E402
from ortformer.exporter import export  # noqa: E402
from ortformer.models import load_any  # noqa: E402
from ortformer.contract.parity import GATES, Case, grid, make_mask  # noqa: E402

transformers = pytest.importorskip("transformers")
GATE = GATES["float32"]


def save_hf(model_cls, config, folder: Path, *, safetensors: bool = True, seed: int = 0,
            random_biases: bool = False) -> Path:
    """A random-init ``model_cls(config)`` saved with save_pretrained into ``folder``; with
    ``random_biases`` every Linear bias is drawn too (transformers inits them to zero, where a bias
    mapped to the wrong place, or left out, would not show)."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # LayerNorm weights/biases away from 1/0, so a mapping slip shows
        for name, p in model.named_parameters():
            norm = "norm" in name.lower() or name.endswith((".ln.weight", ".ln.bias"))
            if (norm or (random_biases and name.endswith(".bias"))) and p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder), safe_serialization=safetensors)
    if not safetensors and not (folder / "pytorch_model.bin").is_file():
        # this transformers writes safetensors whatever it is asked; write the .bin a folder may hold
        from safetensors.torch import load_file

        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    return folder


def write_folder(folder: Path, config: dict, weights: dict) -> Path:
    """A model folder as remote-code models save theirs: ``config`` as config.json and ``weights``
    (name -> tensor) as model.safetensors; for families transformers has no class to save."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def hf_reference(model_cls, folder: Path):
    """transformers' own ``model_cls`` from ``folder``, eager attention, in eval mode."""
    return model_cls.from_pretrained(str(folder), attn_implementation="eager").eval()


def patch_config(folder: Path, change: dict) -> Path:
    """``folder``'s config.json with the keys of ``change`` set (in place)."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    return folder


def with_config(folder: Path, dest: Path, change: dict) -> Path:
    """A copy of the saved model ``folder`` at ``dest``, its config.json changed by ``change``."""
    shutil.copytree(folder, dest)
    return patch_config(dest, change)


def load_and_export(folder: Path, path: Path, *, text: bool = False, **options):
    """load_any(folder) exported to ``path`` with its source and family, and with ``text`` also its
    tokenizer, text length and prompts; returns (loaded, path)."""
    loaded = load_any(folder)
    export(loaded.model, path, **loaded.export_options(text), **options)
    return loaded, path


def cases(cfg) -> list[Case]:
    """The parity grid's shapes with no, right and left padding."""
    return [c for c in grid(cfg) if c.padding in ("none", "right", "left")]


def inputs_for(cfg, case: Case, pad_id: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids that avoid pad_id where kept and are pad_id where padded (as a tokenizer pads)."""
    rng = np.random.default_rng(seed)
    mask = make_mask(case, rng)
    ids = rng.integers(0, cfg.vocab_size - 1, size=mask.shape, dtype=np.int64)
    ids = np.where(ids >= pad_id, ids + 1, ids)  # never the pad id among kept tokens
    ids = np.where(mask == 1, ids, pad_id)
    return {"input_ids": ids, "attention_mask": mask}


def hf_hidden(model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()


def check_gate(got: np.ndarray, want: np.ndarray, mask: np.ndarray, what: str) -> None:
    keep = mask.astype(bool)
    got, want = got[keep].astype(np.float64), want[keep].astype(np.float64)
    max_abs = np.abs(got - want).max()
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert max_abs <= GATE["max_abs"] and cos.min() >= GATE["min_cosine"], (what, max_abs, cos.min())


def assert_matches_transformers(loaded, hf_model, onnx_path: Path | None, pad_id: int) -> int:
    """ortformer eager (and the ONNX file, when given) against transformers' last_hidden_state
    over the grid; returns the number of cases checked."""
    cfg = loaded.config
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]) if onnx_path else None
    checked = 0
    for i, case in enumerate(cases(cfg)):
        feeds = inputs_for(cfg, case, pad_id, seed=i)
        want = hf_hidden(hf_model, feeds)
        ours = {**feeds}
        if cfg.type_vocab_size:
            ours[contract.TOKEN_TYPE_IDS] = np.zeros_like(feeds["input_ids"])
        with torch.no_grad():
            eager = loaded.model(*[torch.from_numpy(ours[n]) for n in contract.input_names(cfg)])
        check_gate(eager["last_hidden_state"].numpy(), want, feeds["attention_mask"], f"eager {case}")
        if session is not None:
            got = session.run([contract.LAST_HIDDEN_STATE], ours)[0]
            check_gate(got, want, feeds["attention_mask"], f"onnx {case}")
        checked += 1
    assert {c.padding for c in cases(cfg)} == {"none", "right", "left"}
    return checked


def assert_matches_reference(loaded, reference, onnx_path: Path, pad_id: int) -> int:
    """ortformer eager and the ONNX file against ``reference(ids, mask) -> (B, N, F)`` (a family's
    definition written out where transformers has no model) over the grid, each kept token within
    the float32 gate's max_abs; returns the number of cases checked."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    checked = 0
    for i, case in enumerate(cases(loaded.config)):
        feeds = inputs_for(loaded.config, case, pad_id, seed=i)
        want = np.asarray(reference(feeds["input_ids"], feeds["attention_mask"]))
        with torch.no_grad():
            eager = loaded.model(*(torch.from_numpy(a) for a in feeds.values()))["last_hidden_state"].numpy()
        keep = feeds["attention_mask"].astype(bool)
        for what, ours in (("eager", eager), ("onnx", session.run([contract.LAST_HIDDEN_STATE], feeds)[0])):
            err = np.abs(ours - want)[keep].max()
            assert err <= GATE["max_abs"], (what, case, err)
        checked += 1
    assert {c.padding for c in cases(loaded.config)} == {"none", "right", "left"}
    return checked


def assert_only_the_import_matches(loaded, hf_model, **changes) -> None:
    """A mutation check: on one row of ids, the import matches transformers (within 1e-4) and the mutant,
    the same weights in a model whose config has ``changes`` (without the feature under test; the
    weights it has no module for left out), is off by more than 1e-2."""
    from ortformer.models.encoder import Encoder

    mutant = Encoder(loaded.config.replace(**changes)).eval()
    own = mutant.state_dict()
    mutant.load_state_dict({k: v for k, v in loaded.model.state_dict().items() if k in own})
    ids, mask = torch.tensor([[5, 9, 17, 3, 44, 8, 61, 2, 30]]), torch.ones(1, 9, dtype=torch.long)
    with torch.no_grad():
        want = hf_model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (loaded.model(ids, mask)["last_hidden_state"] - want).abs().max() < 1e-4
        assert (mutant(ids, mask)["last_hidden_state"] - want).abs().max() > 1e-2


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def sentence_folder(folder: Path, tokenizer_dir: Path, *, pooling: str, normalize: bool,
                    prompts: dict | None = None, default_prompt: str | None = None, max_seq_length: int = 64) -> Path:
    """Lay ``folder`` (a saved transformers model) out as sentence-transformers does."""
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    hidden = json.loads((folder / "config.json").read_text())
    width = hidden.get("hidden_size", hidden.get("dim"))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": width, "pooling_mode": pooling}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": default_prompt, "similarity_fn_name": "cosine"}))
    return folder


def mean_pooling_layout(folder: Path, width: int, max_seq_length: int) -> Path:
    """sentence-transformers' Transformer + mean Pooling modules around ``folder``'s own files."""
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": width, "pooling_mode": "mean"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return folder


def st_embeddings(folder: Path, texts: list[str], prompt_name: str | None = None) -> np.ndarray:
    """sentence-transformers' own embeddings of ``texts`` from ``folder``."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(folder), device="cpu", model_kwargs={"attn_implementation": "eager"})
    return model.encode(texts, prompt_name=prompt_name, convert_to_numpy=True, batch_size=8)


def assert_same_embeddings(got: np.ndarray, want: np.ndarray) -> None:
    got, want = got.astype(np.float64), want.astype(np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert np.abs(got - want).max() <= GATE["max_abs"] and cos.min() >= GATE["min_cosine"]


def assert_sentence_transformers_parity(folder: Path, onnx_path: Path, texts: list[str], tokenizer_dir: Path, *,
                                        pooling: str, normalize: bool) -> None:
    """``folder`` (a saved transformers model) laid out for sentence-transformers, exported with
    its tokenizer, embeds ``texts`` as sentence-transformers' own encode() does."""
    from ortformer.runtime import Runtime

    sentence_folder(folder, tokenizer_dir, pooling=pooling, normalize=normalize)
    _, path = load_and_export(folder, onnx_path, text=True)
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(folder, texts))
