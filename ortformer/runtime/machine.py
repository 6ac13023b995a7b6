"""What this CPU is, as far as choosing an engine and a precision goes: its model name and the
instruction-set flags that change which kernels run (and so how fast, and for bfloat16 whether
at all).

Everything reads /proc/cpuinfo through ``cpuinfo()``, the one function tests replace to fake
another CPU. Where the file cannot be read (not Linux) the CPU has no name and no flags: a
precision that needs a flag is refused there, and a tuned choice recorded elsewhere does not
match it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..modelfile.int8_kernels import cpu_flags

# bfloat16 dot products in hardware: AVX512_BF16 (VDPBF16PS, Cooper Lake, Zen 4) or AMX's tiles
# (TDPBF16PS, Sapphire Rapids). Without either, OpenVINO's CPU plugin would convert to bfloat16
# and back in software (or silently run float32): no speed to gain, so it is refused.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# the flags that decide which GEMM kernels onnxruntime (MLAS) and OpenVINO (oneDNN) pick: a
# choice measured on a CPU with other values of these was measured on other kernels
RELEVANT_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                  "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimddp", "sve")


def cpuinfo() -> str:
    """/proc/cpuinfo's text, or "" where it cannot be read."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class CPU:
    """model: /proc/cpuinfo's "model name" ("" when absent); flags: every flag it lists."""

    model: str
    flags: frozenset[str]

    @property
    def relevant_flags(self) -> list[str]:
        """The flags of RELEVANT_FLAGS this CPU has, sorted."""
        return sorted(self.flags.intersection(RELEVANT_FLAGS))

    def identity(self, threads: int) -> dict:
        """What a tuned choice is keyed by: {"cpu": model name, "flags": relevant flags, "threads": n}."""
        return {"cpu": self.model, "flags": self.relevant_flags, "threads": int(threads)}

    def bfloat16_missing(self) -> str | None:
        """None when the CPU computes bfloat16 in hardware, else a sentence naming the missing flags."""
        if self.flags.intersection(BF16_FLAGS):
            return None
        name = f" ({self.model})" if self.model else ""
        return f"this CPU{name} lists neither {' nor '.join(BF16_FLAGS)} in /proc/cpuinfo"


def this_cpu() -> CPU:
    """The CPU this process runs on, read from cpuinfo()."""
    text = cpuinfo()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
            break
    return CPU(model, cpu_flags(text))
