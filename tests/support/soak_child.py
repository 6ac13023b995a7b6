"""Load test run by test_soak.py in a clean, torch-free child process (not collected).

One Runtime, many threads, random shapes: every result must equal a single-threaded
run of the same request, bit for bit; resident memory after warm-up must stay flat
and no file descriptor may leak. Prints one JSON summary line.

usage: python soak_child.py MODEL PROVIDER CALLS THREADS SEED
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import threading
import time

import numpy as np

from ortformer.core.errors import InputError
from ortformer.runtime import Runtime


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def requests(cfg, count: int, rng: np.random.Generator) -> list[tuple[str, dict, bool]]:
    """(kind, kwargs, valid): run calls of random (B, N) with padding, embed calls, and ~5% bad ones."""
    out = []
    for _ in range(count):
        b, n = int(rng.integers(1, 5)), int(rng.integers(1, cfg.max_positions + 1))
        roll = rng.random()
        if roll < 0.05:  # an invalid request mixed into the traffic
            out.append(("run", {"input_ids": rng.integers(cfg.vocab_size, 2 * cfg.vocab_size, size=(b, n))}, False))
        elif roll < 0.15:
            sequences = [rng.integers(0, cfg.vocab_size, size=int(rng.integers(1, n + 1))).tolist() for _ in range(b)]
            out.append(("embed", {"sequences": sequences, "batch_size": int(rng.integers(1, 4))}, True))
        else:
            mask = (rng.random((b, n)) < 0.85).astype(np.int64)
            mask[:, 0] = 1
            if b > 1 and rng.random() < 0.2:
                mask[-1] = 0  # a fully padded row
            kwargs = {"input_ids": rng.integers(0, cfg.vocab_size, size=(b, n)), "attention_mask": mask}
            if cfg.type_vocab_size:
                kwargs["token_type_ids"] = rng.integers(0, cfg.type_vocab_size, size=(b, n))
            out.append(("run", kwargs, True))
    return out


def call(rt: Runtime, kind: str, kwargs: dict):
    if kind == "embed":
        return {"sentence_embedding": rt.embed(**kwargs)}
    return rt.run(**kwargs)


def digest(outputs: dict) -> tuple:
    """Bit-exact fingerprint of a result (keeps 100,000 expected results out of memory)."""
    return tuple((name, value.dtype.str, value.shape, hashlib.blake2b(np.ascontiguousarray(value).tobytes()).hexdigest())
                 for name, value in sorted(outputs.items()))


def main() -> None:
    model, provider, calls, threads, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    fds_start = open_fds()
    rt = Runtime(model, provider, threads=1)
    rng = np.random.default_rng(seed)
    work = requests(rt.config, calls, rng)

    start = time.perf_counter()
    expected = []
    for kind, kwargs, valid in work:  # single-threaded reference (also the warm-up)
        try:
            expected.append(digest(call(rt, kind, kwargs)))
        except InputError:
            expected.append(None)
    single_seconds = time.perf_counter() - start
    gc.collect()
    rss_warm, fds_warm = rss_kib(), open_fds()

    mismatches, unexpected, nonfinite, done = [], [], [0], [0]
    lock = threading.Lock()

    def worker(offset: int) -> None:
        order = list(range(offset, len(work), threads))  # each thread its share, in its own order
        np.random.default_rng(offset).shuffle(order)
        for i in order:
            kind, kwargs, valid = work[i]
            try:
                got = call(rt, kind, kwargs)
            except InputError:
                got = None
            except Exception as exc:  # noqa: BLE001
                with lock:
                    unexpected.append(f"{i}: {type(exc).__name__}: {exc}")
                continue
            fingerprint = None if got is None else digest(got)
            bad_values = 0 if got is None else sum(1 for value in got.values() if not np.isfinite(value).all())
            with lock:
                done[0] += 1
                nonfinite[0] += bad_values
                if (got is None) != (expected[i] is None) or (got is None) == valid:
                    mismatches.append(f"{i}: valid={valid} got {'error' if got is None else 'result'}")
                elif fingerprint != expected[i]:
                    mismatches.append(f"{i}: {kind} result differs from the single-threaded one")

    start = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    threaded_seconds = time.perf_counter() - start
    gc.collect()
    rss_end, fds_end = rss_kib(), open_fds()

    # opening and dropping Runtimes must not leak descriptors either
    for _ in range(10):
        extra = Runtime(model, provider, threads=1)
        extra.run(input_ids=[[1, 2, 3]])
        del extra
    gc.collect()
    fds_after_reopen = open_fds()

    print(json.dumps({
        "provider": rt.provider, "calls": len(work), "threads": threads, "completed": done[0],
        "invalid_requests": sum(1 for _, _, v in work if not v),
        "mismatches": mismatches[:20], "mismatch_count": len(mismatches), "unexpected": unexpected[:20],
        "nonfinite_returned": nonfinite[0],
        "rss_warm_kib": rss_warm, "rss_end_kib": rss_end, "rss_growth": (rss_end - rss_warm) / rss_warm,
        "fds_start": fds_start, "fds_warm": fds_warm, "fds_end": fds_end, "fds_after_reopen": fds_after_reopen,
        "single_thread_seconds": round(single_seconds, 2), "threaded_seconds": round(threaded_seconds, 2),
        "torch_imported": "torch" in sys.modules,
    }), flush=True)


if __name__ == "__main__":
    main()
