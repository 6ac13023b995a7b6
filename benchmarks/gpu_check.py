"""The CUDA path on a real GPU: strictness, parity, IO binding, float16, throughput, long inputs, soak.

    python benchmarks/gpu_check.py WORKDIR OUT.json [--budget-s 330] [--sections a,b]

WORKDIR holds what benchmarks/gpu_models.py wrote (exported on a CPU machine). Writes ONE
JSON object to OUT.json, rewritten after every section, so a run cut short keeps what it
measured; each section runs in its own try/except and records its error instead of stopping
the others. Sections, in order:
- strictness: provider="cuda" runs on CUDAExecutionProvider (get_providers() agrees);
  out-of-range ids are refused by Runtime's validation before the run, and what the raw
  CUDA session does with them; a device index that does not exist is a ProviderError;
- parity: per attention kind, float32 on CUDA against the CPU provider over the parity grid
  (cuda_parity.report) and against eager PyTorch on CUDA (parity.run_parity), gate GATES["cuda"];
- io_binding: Runtime.run (IO binding) against the plain session.run on CUDA, equal outputs
  and ms per call;
- float16: the float16 exports on CUDA against the float32 file on the CPU (GATES["float16"]);
- throughput: tokens/s over batch x sequence (gpu_bench.SHAPES), float32 and float16, against
  transformers on the same GPU with the same weights (gpu_bench.py);
- long_linear: the chunked linear model at 131,072 (and 1,048,576) tokens on CUDA;
- soak: tests/support/soak_child.py on CUDA (8 threads, 2,000 calls), GPU memory sampled;
- profile, kernels: where bert-base's time goes on the GPU (gpu_bench.profile, gpu_bench.kernels);
- fast_path: the key-length float16 graph (export --padding right) against the (B, N)-mask float16
  graph and transformers float16 SDPA, bert-base and all-MiniLM-L6-v2 at SHAPES and a real-text
  length mix, the attention kernel onnxruntime picks, padded-row parity (gpu_fast_path.py).
  Not in the default list: run it as `--sections fast_path --budget-s 420` (about 8 minutes).
Without a usable CUDA provider every section records {"skipped": reason}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cuda_parity
import gpu_bench
import gpu_fast_path

from ortformer import contract
from ortformer.core.errors import InputError, ProviderError
from ortformer.contract.parity import GATES, Case, compare, make_inputs, passes, run_parity
from ortformer.runtime import Runtime
from ortformer.runtime.providers import CPU_EP, CUDA_EP

KINDS = ("softmax", "linear", "efficient", "cosine")
IO_SHAPES = ((1, 128), (32, 128), (256, 128))
LONG_LENGTHS = (131072, 1_048_576)  # the second only while the budget lasts
SOAK_CHILD = HERE.parent / "tests" / "support" / "soak_child.py"


MISSING_DEVICE = """
import sys
from ortformer.core.errors import ProviderError
from ortformer.runtime import Runtime
try:
    Runtime(sys.argv[1], sys.argv[2], device_id=7)
    print("OPENED")
except ProviderError as exc:
    print("ProviderError: " + str(exc)[:300].replace(chr(10), " "))
"""


def summary(report: dict) -> dict:
    """A grid report without its passing cases (the JSON stays readable)."""
    failed = [c for c in report.get("cases", []) if not all(m["passed"] for m in c["outputs"].values())]
    return {**{k: v for k, v in report.items() if k != "cases"}, "cases": len(report.get("cases", [])),
            "failed_cases": failed}


def strictness(work: Path) -> dict:
    rt = Runtime(work / "parity_softmax.onnx", gpu_bench.DEVICE)
    out = {"provider": rt.provider, "session_providers": rt._session.get_providers(), "device_id": rt.device_id}
    vocab = rt.config.vocab_size
    refused = {}
    for label, bad in (("id = vocab_size", vocab), ("id = -1", -1), ("id = 10 * vocab_size", 10 * vocab)):
        try:
            rt.run(input_ids=[[1, bad, 2]])
            refused[label] = "ACCEPTED"
        except InputError as exc:
            refused[label] = f"InputError: {exc}"
    out["out_of_range_ids"] = refused
    # what validation protects against: the raw CUDA session given the same ids
    feeds = {contract.INPUT_IDS: np.array([[1, vocab, 2]], np.int64),
             contract.ATTENTION_MASK: np.ones((1, 3), np.int64)}
    if contract.TOKEN_TYPE_IDS in rt.input_names:
        feeds[contract.TOKEN_TYPE_IDS] = np.zeros((1, 3), np.int64)
    try:
        raw = rt._session.run([contract.LAST_HIDDEN_STATE], feeds)[0]
        out["raw_session_out_of_range"] = {"raised": False, "finite": bool(np.isfinite(raw).all())}
    except Exception as exc:  # noqa: BLE001  (onnxruntime's errors share no base class)
        out["raw_session_out_of_range"] = {"raised": True, "error": str(exc)[:300]}
    # in a child: a CUDA failure inside onnxruntime must not take this process down with it
    child = subprocess.run([sys.executable, "-c", MISSING_DEVICE, str(work / "parity_softmax.onnx"), gpu_bench.DEVICE],
                           capture_output=True, text=True, timeout=120, check=False)
    out["missing_device_7"] = (child.stdout.strip().splitlines() or [f"exit {child.returncode}: {child.stderr[-300:]}"])[-1]
    out["passed"] = (rt.provider == gpu_bench.DEVICE and out["session_providers"][0] == expected_ep()
                     and all(v.startswith("InputError") for v in refused.values())
                     and out["missing_device_7"].startswith("ProviderError"))
    return out


def cuda_eager(work: Path, rt: Runtime):
    """The eager model on CUDA (rebuilt from the config and seed 0), or None with the reason
    when its weights differ from the exported ones (gpu_models.py records their digests)."""
    import torch

    from ortformer.exporter.export import weights_digest
    from ortformer.models import build_encoder

    model = build_encoder(rt.config, seed=0)
    digests = json.loads((work / "digests.json").read_text())
    if weights_digest(model) != digests[rt.config.attention]:
        return None, "torch here builds other random weights than at export"
    model = model.to(gpu_bench.DEVICE)
    names = contract.input_names(rt.config)

    def run(inputs: dict) -> dict:
        with torch.inference_mode():
            outputs = model(*(torch.from_numpy(inputs[n]).to(gpu_bench.DEVICE) for n in names))
        return {k: v.float().cpu().numpy() for k, v in outputs.items()}

    return run, None


def parity(work: Path) -> dict:
    out = {}
    for kind in KINDS:
        path = work / f"parity_{kind}.onnx"
        entry = {"vs_cpu_provider": summary(cuda_parity.report(str(path), provider=gpu_bench.DEVICE))}
        rt = Runtime(path, gpu_bench.DEVICE)
        try:
            eager, why = cuda_eager(work, rt)
            entry["vs_eager_cuda"] = ({"skipped": why} if eager is None else
                                      summary(run_parity(rt._session, eager, rt.config, dtype="cuda")))
        except Exception as exc:  # noqa: BLE001
            entry["vs_eager_cuda"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out[kind] = entry
    out["passed"] = all(e["vs_cpu_provider"].get("passed") and e["vs_eager_cuda"].get("passed", True)
                        for e in out.values())
    return out


def bound_to_host(rt: Runtime, feeds: dict) -> list:
    """IO binding with numpy inputs and outputs bound to host memory (onnxruntime copies)."""
    binding = rt._session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    for name in rt.output_names:
        binding.bind_output(name, "cpu")
    rt._session.run_with_iobinding(binding, rt._run_options)
    return [value.numpy() for value in binding.get_outputs()]


def path_timings(rt: Runtime, feeds: dict) -> dict:
    names, device = rt.output_names, gpu_bench.DEVICE
    return {"ms_io_binding": gpu_bench.median_ms(lambda: rt._run_bound(feeds, device, 0, names)),
            "ms_plain_run": gpu_bench.median_ms(lambda: rt._session.run(names, feeds, rt._run_options)),
            "ms_bound_to_host": gpu_bench.median_ms(lambda: bound_to_host(rt, feeds)),
            "ms_runtime_run": gpu_bench.median_ms(lambda: rt.run(**feeds))}


def io_binding(work: Path) -> dict:
    """Runtime's IO-binding path (outputs on the device, then copied) against the plain
    session.run and against binding outputs to host memory: equal results, ms per call of each
    path alone, and of Runtime.run (validation and the finite check included)."""
    path = work / "bert_base.onnx" if (work / "bert_base.onnx").exists() else work / "parity_softmax.onnx"
    rt = Runtime(path, gpu_bench.DEVICE)
    out = {"model": path.name}
    rng = np.random.default_rng(0)
    for b, n in IO_SHAPES:
        n = min(n, rt.config.max_sequence)
        feeds = make_inputs(rt.config, Case(b, n, "right"), rng)
        names = rt.output_names
        bound = rt._run_bound(feeds, gpu_bench.DEVICE, 0, names)
        plain = dict(zip(names, rt._session.run(names, feeds, rt._run_options)))
        host = dict(zip(names, bound_to_host(rt, feeds)))
        out[f"{b}x{n}"] = {
            "equal": all(np.array_equal(bound[k], plain[k]) and np.array_equal(host[k], plain[k]) for k in names),
            "max_abs_difference": max(float(np.abs(bound[k] - plain[k]).max()) for k in names),
            **path_timings(rt, feeds),
        }
    out["passed"] = all(v["equal"] for k, v in out.items() if isinstance(v, dict))
    return out


def float16(work: Path) -> dict:
    out = {}
    for kind in KINDS:
        report = cuda_parity.report(str(work / f"parity_{kind}_fp16.onnx"), reference=str(work / f"parity_{kind}.onnx"),
                                    gate=GATES["float16"], provider=gpu_bench.DEVICE)
        out[kind] = summary(report)
    out["passed"] = all(v.get("passed") for v in out.values())
    return out


def long_length(rt: Runtime, cpu: Runtime, n: int) -> dict:
    """One length: chunked on CUDA (twice: the first opens the stages), the whole graph on CUDA
    in one run (linear attention needs O(N) memory), and (at the first length) the CPU."""
    ids = np.random.default_rng(n).integers(0, rt.config.vocab_size, (1, n))
    mask = np.ones((1, n), np.int64)
    entry = {}
    start = time.perf_counter()
    chunked = rt.run(input_ids=ids)[contract.LAST_HIDDEN_STATE]
    entry["cuda_chunked_first_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    rt.run(input_ids=ids)
    entry["cuda_chunked_s"] = round(time.perf_counter() - start, 3)
    entry["stage_providers"] = sorted({s.get_providers()[0] for s in rt.chunk_runner().sessions.values()})
    start = time.perf_counter()
    whole = rt._run_bound({contract.INPUT_IDS: ids, contract.ATTENTION_MASK: mask}, gpu_bench.DEVICE, 0,
                          [contract.LAST_HIDDEN_STATE])[contract.LAST_HIDDEN_STATE]
    entry["cuda_whole_graph_s"] = round(time.perf_counter() - start, 3)
    m = compare(contract.LAST_HIDDEN_STATE, whole, chunked, mask)
    entry["whole_vs_chunked"] = {**m, "passed": passes(m, GATES["cuda"])}
    if n == LONG_LENGTHS[0]:
        start = time.perf_counter()
        reference = cpu.run(input_ids=ids)[contract.LAST_HIDDEN_STATE]
        entry["cpu_chunked_s"] = round(time.perf_counter() - start, 3)
        m = compare(contract.LAST_HIDDEN_STATE, chunked, reference, mask)
        entry["cuda_vs_cpu"] = {**m, "passed": passes(m, GATES["cuda"])}
    entry["passed"] = (entry["stage_providers"] == [expected_ep()] and entry["whole_vs_chunked"]["passed"]
                       and entry.get("cuda_vs_cpu", {"passed": True})["passed"])
    return entry


def long_linear(work: Path, deadline: float) -> dict:
    path = work / "long_linear.onnx"
    rt, cpu = Runtime(path, gpu_bench.DEVICE), Runtime(path, "cpu")
    out = {"chunk_size": rt.chunk_size, "max_sequence": rt.config.max_sequence}
    for n in LONG_LENGTHS:
        if n > rt.config.max_sequence or time.monotonic() > deadline - 30:
            out[f"{n}"] = {"skipped": "longer than the model's max_sequence" if n > rt.config.max_sequence
                           else "out of time"}
            continue
        try:
            out[f"{n}"] = long_length(rt, cpu, n)
        except Exception as exc:  # noqa: BLE001  (a longer length may fail where a shorter one passed)
            out[f"{n}"] = {"error": f"{type(exc).__name__}: {exc}"[:500], "passed": False}
    out["passed"] = all(e.get("passed", True) for e in out.values() if isinstance(e, dict))
    return out


def expected_ep() -> str:
    return CUDA_EP if gpu_bench.DEVICE == "cuda" else CPU_EP


def gpu_memory_mib() -> int | None:
    """The GPU's used memory (all processes), or None without nvidia-smi."""
    if gpu_bench.DEVICE != "cuda":
        return None
    answer = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, timeout=20, check=False)
    return int(answer.stdout.split()[0])


def sampled(fn, interval: float = 0.05) -> tuple[object, list]:
    """fn()'s result and the GPU's used MiB sampled while it ran [(seconds, MiB)]."""
    samples, done = [], threading.Event()

    def sample() -> None:
        start = time.perf_counter()
        while not done.is_set():
            samples.append((round(time.perf_counter() - start, 2), gpu_memory_mib()))
            done.wait(interval)

    poller = threading.Thread(target=sample, daemon=True)
    poller.start()
    try:
        return fn(), samples
    finally:
        done.set()
        poller.join()


def arena_rounds(work: Path, calls: int, threads: int, rounds: int = 3) -> dict:
    """The soak's traffic (soak_child.requests) from `threads` threads on one Runtime, `rounds`
    times over: the GPU's peak per round. Bounded: no later round peaks higher than the first
    (plus 64 MiB), i.e. the arena (kSameAsRequested growth, shrinkage after each run) does not
    keep what odd shapes once took."""
    spec = importlib.util.spec_from_file_location("soak_child", SOAK_CHILD)
    child = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(child)
    rt = Runtime(work / "soak.onnx", gpu_bench.DEVICE, threads=1)
    traffic = child.requests(rt.config, calls, np.random.default_rng(11))

    def one_round() -> None:
        def worker(offset: int) -> None:
            for kind, kwargs, _ in traffic[offset::threads]:
                try:
                    child.call(rt, kind, kwargs)
                except InputError:
                    pass

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()

    peaks = []
    for _ in range(rounds):
        _, samples = sampled(one_round)
        peaks.append(max((m for _, m in samples if m is not None), default=None))
    known = [p for p in peaks if p is not None]
    bounded = not known or max(known[1:], default=known[0]) <= known[0] + 64
    return {"calls_per_round": calls, "threads": threads, "peak_mib_per_round": peaks,
            "mib_after": gpu_memory_mib(), "bounded": bounded}


def soak(work: Path, calls: int = 2000, threads: int = 8) -> dict:
    """soak_child.py in a torch-free child (results equal single-threaded runs bit for bit, RSS
    and file descriptors flat), then arena_rounds here for the GPU's memory."""
    before = gpu_memory_mib()
    child, samples = sampled(lambda: subprocess.run(
        [sys.executable, str(SOAK_CHILD), str(work / "soak.onnx"), gpu_bench.DEVICE, str(calls), str(threads), "7"],
        capture_output=True, text=True, timeout=240, check=False), interval=0.25)
    if child.returncode != 0:
        return {"error": child.stderr[-2000:], "gpu_mib_samples": samples}
    result = json.loads(child.stdout.strip().splitlines()[-1])
    if not result.get("mismatches"):
        result.pop("mismatches", None)
    result["gpu_mib_child"] = {"before": before, "samples": samples[:: max(1, len(samples) // 40)]}
    result["arena"] = arena_rounds(work, calls, threads)
    result["passed"] = (result["mismatch_count"] == 0 and not result["unexpected"] and result["completed"] == calls
                        and result["nonfinite_returned"] == 0 and result["arena"]["bounded"]
                        and result["rss_growth"] < 0.20
                        and result["fds_end"] == result["fds_warm"] == result["fds_after_reopen"])
    return result


def environment() -> dict:
    import onnxruntime as ort

    env = {"python": platform.python_version(), "onnxruntime": ort.__version__, "onnxruntime_file": ort.__file__,
           "available_providers": ort.get_available_providers()}
    try:
        import torch

        env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0))
    except Exception as exc:  # noqa: BLE001
        env["torch"] = f"unavailable: {exc}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False)
        env["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except OSError as exc:
        env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop starting new work after this long")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu rehearses the script on a machine without a GPU (its figures mean nothing)")
    parser.add_argument("--sections", default="strictness,parity,io_binding,float16,throughput,long_linear,soak,profile,kernels")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    gpu_bench.DEVICE = args.device
    work, report = args.workdir, {"command": " ".join(sys.argv), "environment": None, "sections": {}}

    def save() -> None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=str))
        os.replace(tmp, args.out)

    report["environment"] = environment()
    save()
    try:
        Runtime(work / "soak.onnx", gpu_bench.DEVICE)
        usable = None
    except ProviderError as exc:
        usable = str(exc)
    sections = {
        "strictness": lambda: strictness(work), "parity": lambda: parity(work), "io_binding": lambda: io_binding(work),
        "float16": lambda: float16(work), "throughput": lambda: gpu_bench.throughput(work, deadline - 90),
        "long_linear": lambda: long_linear(work, deadline), "soak": lambda: soak(work),
        "profile": lambda: gpu_bench.profile(work), "kernels": lambda: gpu_bench.kernels(work),
        "fast_path": lambda: gpu_fast_path.fast_path(work, deadline - 20),
    }
    if args.device == "cpu":
        gpu_bench.TIMING_S = min(gpu_bench.TIMING_S, 0.05)
    for name in args.sections.split(","):
        start = time.perf_counter()
        if usable is not None:
            result = {"skipped": f"CUDA is not usable here: {usable}"}
        elif time.monotonic() > deadline:
            result = {"skipped": "out of time"}
        else:
            try:
                result = sections[name]()
            except Exception as exc:  # noqa: BLE001  (one failure must leave the other sections)
                result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.perf_counter() - start, 2)
        report["sections"][name] = result
        save()
        verdict = "skipped" if "skipped" in result else "ERROR" if "error" in result else \
            "PASS" if result.get("passed", True) else "FAIL"
        print(f"{name}: {verdict} ({result['seconds']} s)", flush=True)
    return 0 if all(s.get("passed", "error" not in s) for s in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
