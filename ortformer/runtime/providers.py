"""Execution providers: what to ask onnxruntime for, and why CUDA did not load.

`onnxruntime.get_available_providers()` lists the providers a build was compiled
with: the onnxruntime-gpu wheel lists CUDA on a machine with no GPU, no driver or
missing CUDA libraries. The only reliable test is to create a session and read
`session.get_providers()`; this module builds the request and explains failures.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import onnxruntime as ort

from ..core.checks import check_int
from ..core.errors import ProviderError
from ..core.cpus import available_cpus
from .openvino_session import OPENVINO_EP

# onnxruntime's providers (what profile, serve and "auto" choose among)
PROVIDERS = ("auto", "cpu", "cuda")
# Runtime also runs a file on the OpenVINO runtime, only when asked by name (runtime/openvino_session.py),
# and what `ortformer tune --write` recorded for this CPU (runtime/tuned.py)
RUNTIME_PROVIDERS = (*PROVIDERS, "openvino", "tuned")
# what Runtime(precision=...) may ask a provider to compute in, beside the file's own (None)
PRECISIONS = ("float32", "bfloat16")
# where `ortformer check` reruns the parity grid (CUDA has its own script: docs/gpu.md)
VERIFY_PROVIDERS = ("cpu", "openvino")
CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
SHORT_NAMES = {CPU_EP: "cpu", CUDA_EP: "cuda", OPENVINO_EP: "openvino"}

# device ids on which CUDA failed to load in this process: "auto" skips them, so a
# GPU build on a GPU-less machine tries (and logs the failure) once, not per Runtime.
# Module state on purpose: missing CUDA libraries do not appear mid-process.
_cuda_failed: set[int] = set()


# more intra-op threads than this per usable core only adds switching (10,000 hung a run)
THREADS_PER_CORE = 4


def check_request(provider: str, device_id: int, threads: int | None) -> None:
    if provider not in RUNTIME_PROVIDERS:
        raise ProviderError(f"unknown provider {provider!r}; choose one of {', '.join(RUNTIME_PROVIDERS)}")
    check_int("device_id", device_id, low=0, error=ProviderError, why=" (a CUDA device index)")
    if threads is not None:
        limit = THREADS_PER_CORE * available_cpus()
        check_int("threads", threads, high=limit,
                  why=f" ({THREADS_PER_CORE} per usable core), or None for onnxruntime's default")


def check_precision(provider: str, precision: str | None, cpu=None) -> None:
    """precision=None (the file's own) runs anywhere; "float32" too; "bfloat16" only on
    provider="openvino" and a CPU that computes it (machine.BF16_FLAGS), else ProviderError
    naming what is missing. cpu: a machine.CPU, for tests (default: this one)."""
    if precision is None or precision == "float32":
        if precision is not None and provider == "tuned":
            raise ProviderError("provider='tuned' takes its precision from the tuned record; leave precision=None")
        return
    if precision not in PRECISIONS:
        raise ProviderError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}, or None "
                            "for the file's own")
    if provider != "openvino":
        raise ProviderError(f"precision={precision!r} runs on provider='openvino' only (onnxruntime computes a "
                            "float32 file in float32); use provider='openvino', or export --quantize int8 for "
                            "onnxruntime's fast path")
    from .machine import BF16_FLAGS, this_cpu

    missing = (cpu or this_cpu()).bfloat16_missing()
    if missing is not None:
        raise ProviderError(f"precision='bfloat16' needs bfloat16 dot products in hardware (the flag "
                            f"{' or '.join(BF16_FLAGS)}): {missing}; use precision='float32' (the default), or "
                            "an int8 file on provider='cpu'")


def session_options(threads: int | None) -> ort.SessionOptions:
    """Options that keep memory bounded when every call has a different (B, N), and that
    leave the cores alone between calls.

    - enable_mem_pattern=False: the memory-pattern planner caches one allocation plan
      per distinct input shape, which grows without bound on free-form traffic.
    - enable_cpu_mem_arena=False: the CPU arena keeps its peak forever (it only
      grows); with it off, tensors come from malloc and large blocks go back to the
      OS after each run. Costs a few percent on tiny inputs, nothing at bert-base scale
      (long sequences pay the page faults: `ortformer bench --scenario long` shows both).
    - spinning: see spin_within_runs.
    The CUDA arena is bounded separately (see provider_list and Runtime._run_options).
    """
    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    options.enable_cpu_mem_arena = False
    spin_within_runs(options)
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


# how long an idle intra-op worker busy-waits for the next op before it sleeps (microseconds)
SPIN_MICROSECONDS = 20


def spin_within_runs(options: ort.SessionOptions) -> ort.SessionOptions:
    """Workers busy-wait between the ops of a run, for at most SPIN_MICROSECONDS each time
    (session.intra_op.spin_duration_us), and sleep as soon as the run returns
    (session.force_spinning_stop).

    - Spinning after each run, onnxruntime's default, took the cores from whatever ran next:
      two sessions alternating in one process on 2 cores ran 3x slower, and a library inside
      someone else's app must not burn idle CPU.
    - Spinning without bound within a run lost most on a loaded machine: with more runnable
      threads than cores, a worker spins while the one it waits on is descheduled. all-MiniLM-
      L6-v2 at 2 threads, load average 13-21 on 2 cores (benchmarks/cpu_float32_gap.py): a 20 us
      bound ran 1.55-1.73x (float32) and 2.71x (int8) the unbounded spin, faster in every
      round of every run; no spinning at all 1.57-2.21x and 1.91x.
    - No spinning at all costs a wake-up per op on a quiet machine: 2-7% in float32 and 12-19%
      in int8 in one run, within the noise in a later one; the short spin keeps the wake-ups
      of back-to-back ops. At 1 thread there are no workers, and the settings measure alike.
    """
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_MICROSECONDS))
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


# onnxruntime's AttentionBackend bits (contrib_ops/cpu/bert/attention_common.h): flash 1, memory-efficient
# (cutlass) 2, TensorRT fused 4, cuDNN flash 8, unfused 16, TensorRT flash 32, cross 64, causal 128. A
# positive sdpa_kernel enables exactly these; 0 is onnxruntime's default, which leaves cuDNN off.
# A key-length file (export padding="right") asks for every default one plus cuDNN, the only fused kernel
# that takes key lengths on sm90 (H100/H200): TensorRT's fused runner is built for sm70-sm89 only
# (contrib_ops/cuda/bert/tensorrt_fused_multihead_attention/mha_runner.cu). Unmeasured: docs/gpu.md.
KEY_LENGTH_SDPA_KERNELS = 1 | 2 | 4 | 8 | 16 | 32 | 64


def provider_list(provider: str, device_id: int, key_lengths: bool = False) -> list:
    """The providers argument for InferenceSession; CPU is always last as the fallback.
    key_lengths: the file's attention takes key lengths (KEY_LENGTH_SDPA_KERNELS)."""
    if provider == "cpu":
        return [CPU_EP]
    if provider == "auto" and (CUDA_EP not in ort.get_available_providers() or device_id in _cuda_failed
                               or _cuda_library_error() is not None):
        # CUDA cannot load: skip the attempt (and onnxruntime's red log lines), as "auto" promises
        return [CPU_EP]
    # kSameAsRequested: grow the GPU arena by what a call needs, not the next power of two,
    # so a stream of odd shapes does not double the reservation each time.
    # use_tf32=0: onnxruntime's CUDA provider rounds float32 MatMul inputs to TF32 (10-bit
    # mantissa) by default; on an H200 that put a float32 file 1.5e-3 (max_rel 1.6e-3) from
    # float32 PyTorch on all-MiniLM-L6-v2, past the CUDA gate. A float32 file computes in
    # float32; export --dtype float16 is the fast path (docs/gpu.md).
    cuda_options = {"device_id": str(device_id), "arena_extend_strategy": "kSameAsRequested", "use_tf32": "0"}
    if key_lengths:
        cuda_options["sdpa_kernel"] = str(KEY_LENGTH_SDPA_KERNELS)
    return [(CUDA_EP, cuda_options), CPU_EP]


def remember_cuda_failure(device_id: int) -> None:
    """Later "auto" requests for this device go straight to CPU."""
    _cuda_failed.add(device_id)


def cuda_failure_reason(device_id: int) -> str:
    """Best explanation we can give for CUDA not loading (onnxruntime only logs it)."""
    if CUDA_EP not in ort.get_available_providers():
        return (
            f"this onnxruntime build ({ort.__version__}, providers {ort.get_available_providers()}) has no CUDA "
            "support; install onnxruntime-gpu"
        )
    library_error = _cuda_library_error()
    if library_error is not None:
        return f"the CUDA provider library cannot load: {library_error} (CUDA/cuDNN libraries missing or mismatched)"
    return (
        f"the CUDA provider could not start on device_id={device_id}: no visible GPU, a driver too old "
        "for this onnxruntime, or a device index out of range (onnxruntime's log on stderr has details)"
    )


@functools.cache
def _cuda_library_error() -> str | None:
    """Why onnxruntime's CUDA provider library cannot be loaded, or None when it loads (or
    this build has none to try). dlopen names the missing dependency (e.g. libcublasLt.so.13)
    without onnxruntime logging anything; the answer cannot change within a process."""
    library = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if not library.exists():
        return None
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return str(exc)
    return None


def short_name(session: ort.InferenceSession) -> str:
    """'cuda', 'cpu' or 'openvino': the provider that actually runs the graph (the first one listed)."""
    return SHORT_NAMES.get(session.get_providers()[0], session.get_providers()[0])
