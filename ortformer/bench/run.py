"""Run benchmark scenarios and write bench.json / bench_long.png. Needs torch (export extra)."""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

from ..core.errors import ConfigError, require_torch
from ..core.fsutil import write_atomic
from ..core.cpus import available_cpus

require_torch("ortformer bench")

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from .._version import __version__  # noqa: E402
from .peers import format_peers  # noqa: E402
from .plot import plot_long  # noqa: E402
from .scenarios import SCENARIOS  # noqa: E402

SCHEMA = 1


def run_bench(scenarios: list[str], out_dir: Path, threads: int | None = None, quick: bool = False,
              iterations: int | None = None, progress=None, registry: dict | None = None) -> dict:
    """Run the named scenarios; write bench.json (and bench_long.png) into out_dir.

    registry: name -> scenario function (default SCENARIOS); the peer harness in the
    repository's benchmarks/ passes its own (real, serve, cpu-engines)."""
    registry = SCENARIOS if registry is None else registry
    unknown = [s for s in scenarios if s not in registry]
    if unknown:
        raise ConfigError(f"unknown scenario(s) {unknown}; choose from {', '.join(registry)}")
    threads = threads or available_cpus()
    iterations = iterations or (3 if quick else 20)
    torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "schema": SCHEMA, "ortformer": __version__, "quick": quick, "threads": threads, "iterations": iterations,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "onnxruntime": ort.__version__, "torch": torch.__version__},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="ortformer-bench-") as workdir:
        for name in scenarios:
            if progress:
                progress(name)
            start = time.perf_counter()
            outcome = registry[name](Path(workdir), threads, quick, iterations)
            outcome["seconds"] = round(time.perf_counter() - start, 1)
            result["scenarios"][name] = outcome
    if "long" in result["scenarios"]:
        png = out_dir / "bench_long.png"
        result["scenarios"]["long"]["plot"] = str(png) if plot_long(result["scenarios"]["long"], png) else None
    _write_json(out_dir / "bench.json", result)
    return result


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def format_table(result: dict) -> str:
    """Every target beside its measured figure, then each scenario's rows."""
    lines = [f"{'target':<62} {'wanted':>10} {'measured':>12}  met"]
    for scenario in result["scenarios"].values():
        for t in scenario.get("targets", []):
            # the targets are set for full-size models: a --quick run checks the pipeline, not them
            met = "n/a (quick)" if result.get("quick") else ("yes" if t["met"] else "NO")
            lines.append(f"{t['name']:<62} {t['target']:>10} {t['measured']:>11.4g}{t['unit']:<1}  {met}")
    for name, scenario in result["scenarios"].items():
        lines.append(f"\n[{name}] {scenario.get('model', '')} ({scenario['seconds']} s)")
        # what a user would pick instead leads: peers, the MatMul ceiling, and peers that could not run
        if scenario.get("peers"):
            lines.extend(format_peers(scenario["peers"]))
        for peer, why in scenario.get("unavailable", {}).items():
            lines.append(f"  {peer}: not available here ({why})")
        for row in scenario["rows"]:
            lines.append("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        family = scenario.get("family")
        if family:  # a non-BERT family beside the scenario's model, with where its weights came from
            lines.append(f"  {family['family']}: {family['weights']}; min cosine {family['min_cosine_vs_reference']:.6f}")
            for row in family["rows"]:
                lines.append("    " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return "\n".join(lines)


__all__ = ["run_bench", "format_table", "SCENARIOS", "SCHEMA"]
