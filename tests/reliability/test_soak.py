"""Soak and load: one Runtime shared by 8 threads, thousands of calls of random shapes.

Run in a fresh torch-free child (soak_child.py) so resident memory and file
descriptors measure the runtime alone. Guarantees: every threaded result equals the
single-threaded result of the same request bit for bit (bad requests raise
InputError in both), nothing else is raised, no NaN/inf returned, VmRSS after
warm-up grows by less than 20%, and /proc/self/fd holds as many entries after as
before (also after opening and dropping 10 more Runtimes).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.reliability import SUPPORT, child_env, scaled

from ortformer.runtime import Runtime



def soak(model: Path, provider: str, calls: int, threads: int = 8) -> dict:
    out = subprocess.run([sys.executable, str(SUPPORT / "soak_child.py"), str(model), provider, str(calls), str(threads), "7"],
                         check=False, capture_output=True, text=True, env=child_env(), timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(result: dict) -> None:
    assert result["unexpected"] == [], result["unexpected"]
    assert result["mismatch_count"] == 0, result["mismatches"]
    assert result["completed"] == result["calls"] and result["nonfinite_returned"] == 0
    assert result["rss_growth"] < 0.20, result
    assert result["fds_end"] == result["fds_warm"] and result["fds_after_reopen"] == result["fds_warm"], result
    assert not result["torch_imported"]


def test_threads_random_shapes_memory_and_descriptors(tokens_model, figures):
    result = soak(tokens_model, "cpu", scaled(3000))
    figures.set("soak", "cpu", {k: v for k, v in result.items() if k not in ("mismatches", "unexpected")})
    check(result)


def test_cuda_threads_random_shapes_memory_and_descriptors(tokens_model, figures):
    if Runtime(tokens_model, "auto").provider != "cuda":
        pytest.skip("CUDA is not usable here (onnxruntime's CUDA provider does not load)")
    result = soak(tokens_model, "cuda", scaled(3000))
    figures.set("soak", "cuda", {k: v for k, v in result.items() if k not in ("mismatches", "unexpected")})
    check(result)
