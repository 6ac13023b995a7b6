"""Models exported once per test session with the real exporter, shared by
tests/runtime, tests/cli and tests/reliability (export takes ~10 s each on 2 cores)."""
from __future__ import annotations

from pathlib import Path

from ortformer.config import preset

CONFIGS = {
    # token ids, token types, mean pooling: every optional input and output
    "tokens": preset("tiny"),
    # float features (vocab_size = 0), cls pooling
    "features": preset("tiny", vocab_size=0, type_vocab_size=0, pooling="cls"),
    # token ids without token types, no pooling: last_hidden_state only
    "nopool": preset("tiny", type_vocab_size=0, pooling="none"),
}


def exported(kind: str, tmp_path_factory) -> Path:
    """Export CONFIGS[kind] (seed 0, parity off) into the session's temp folder once."""
    from ortformer.exporter import export

    path = tmp_path_factory.getbasetemp() / "exported" / kind / "model.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        export(CONFIGS[kind], path, seed=0, parity=False)
    return path


def without_output(path: Path, dest: Path, name: str) -> Path:
    """A copy of the model file at ``dest`` (put it beside the original, so its tokenizer still
    resolves) without graph output ``name``: a file as the exporter wrote it before that output
    existed (the nodes that computed it stay, unused)."""
    import onnx

    proto = onnx.load(str(path))
    kept = [o for o in proto.graph.output if o.name != name]
    assert len(kept) == len(proto.graph.output) - 1, f"{path} has no output {name!r}"
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save(proto, str(dest))
    return dest
