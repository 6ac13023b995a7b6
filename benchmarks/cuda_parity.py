"""CPU vs CUDA parity of one ortformer model through ortformer.runtime.

    python benchmarks/cuda_parity.py MODEL.onnx [--device-id 0] [--seed 0]

Runs the export parity grid (ortformer.contract.parity: batch 1/2/5, sequence 1..max
(capped at 512), right/left/random padding and a fully padded row) on both providers
with the same random inputs, and prints one JSON object: per case and overall
max_abs = max |cuda - cpu| and min_cosine = min over vectors cos(cuda_i, cpu_i),
over kept tokens (last_hidden_state) and non-empty rows (sentence_embedding).

Exit status: 0 within the gate parity.GATES["cuda"] in every comparison (max_abs <= 1e-3, or
every vector within 1e-4 of its own scale, and min_cosine >= 0.9999 at the time of writing), 1 beyond, and 0 with
{"skipped": true, "reason": ...} where CUDA is not usable on this machine.
The CUDA run goes through IO binding, the path Runtime uses on the GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from ortformer import contract
from ortformer.core.errors import ProviderError
from ortformer.contract.parity import (GATES, compare, fold_worst, grid, make_inputs, passes)  # the gate's own cases and metrics
from ortformer.runtime import Runtime

GATE = GATES["cuda"]


def report(model: str, device_id: int = 0, seed: int = 0, reference: str | None = None,
           gate: dict = GATE, provider: str = "cuda") -> dict:
    """The grid on CUDA (``model``) against the CPU provider (``reference``, default the same
    file): per case and overall metrics, and whether every comparison is within ``gate``;
    {"skipped": True, "reason": ...} where CUDA is not usable. provider="cpu" rehearses the
    comparison on a machine without a GPU."""
    cpu = Runtime(reference or model, "cpu")
    try:
        cuda = Runtime(model, provider, device_id=device_id)
    except ProviderError as exc:
        return {"skipped": True, "reason": str(exc)}

    rng = np.random.default_rng(seed)
    cases, worst, overall, seconds = [], {}, {}, {"cpu": 0.0, "cuda": 0.0}
    passed = True
    for case in grid(cpu.config):
        inputs = make_inputs(cpu.config, case, rng)
        outputs = {}
        for name, runtime in (("cpu", cpu), ("cuda", cuda)):
            start = time.perf_counter()
            outputs[name] = runtime.run(**inputs)
            seconds[name] += time.perf_counter() - start
        metrics = {}
        for output in cpu.output_names:
            m = compare(output, outputs["cuda"][output], outputs["cpu"][output], inputs[contract.ATTENTION_MASK])
            metrics[output] = {"max_abs": m["max_abs"], "max_rel": m["max_rel"], "min_cosine": m["min_cosine"],
                               "passed": passes(m, gate)}
            passed = passed and metrics[output]["passed"]  # per comparison, not on the folded worst case
            fold_worst(worst, output, m)
            fold_worst(overall, "all outputs", m)
        cases.append({"batch": case.batch, "sequence": case.sequence, "padding": case.padding, "outputs": metrics})

    total = overall["all outputs"]
    return {
        "model": model, "reference": reference or model, "device_id": cuda.device_id, "provider": cuda.provider,
        "gate": gate,
        "max_abs": total["max_abs"], "max_rel": total["max_rel"], "min_cosine": total["min_cosine"], "passed": passed,
        "worst": worst, "seconds": {k: round(v, 4) for k, v in seconds.items()}, "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = report(args.model, args.device_id, args.seed)
    print(json.dumps(result, indent=2))
    if result.get("skipped"):
        print(f"SKIPPED: CUDA is not usable here: {result['reason']}", file=sys.stderr)
        return 0
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
