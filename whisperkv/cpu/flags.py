"""What this CPU can do, read once from /proc/cpuinfo: the int8 type's choices and its kernels' builds
depend on it (``cpu/quantize.py``, ``cpu/attend.py``, ``cpu/int8_rows.py``)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def _cpuinfo_field(name: str) -> str:
    """The first ``name`` line's value in /proc/cpuinfo ("" where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.split(":", 1)[0].strip() == name:
            return line.split(":", 1)[1].strip()
    return ""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ``flags`` line of /proc/cpuinfo (empty where there is none)."""
    return frozenset(_cpuinfo_field("flags").split())


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... ("" where /proc/cpuinfo does not say): Intel's MKL, PyTorch's
    BLAS, reads a matrix fastest in another orientation on another maker's CPU (``cpu/row_gemm.py``)."""
    return _cpuinfo_field("vendor_id")


def cpu_has_vnni() -> bool:
    """True when int8 dot products accumulate in 32 bits without saturating (AVX512-VNNI / AVX-VNNI)."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def cpu_has_amx_bf16() -> bool:
    """True when the CPU multiplies bfloat16 tiles (AMX): SDPA's bfloat16 path is fast here."""
    return "amx_bf16" in cpu_flags()


def cpu_has_avx512f() -> bool:
    """True when the float32 step kernels' 512-bit paths run here."""
    return "avx512f" in cpu_flags()


def cpu_has_avx2() -> bool:
    """True when the int8 rows kernel's AVX2 path (16-bit products, ``kernels/int8_avx2.h``) runs here."""
    return "avx2" in cpu_flags()


def cpu_has_avx2_fma_f16c() -> bool:
    """True when the float32 rows kernel's AVX2 path (two 8-lane halves a vector) runs here."""
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def cpu_has_vector_rows() -> bool:
    """True when the float32 rows kernel (``kernels/rows_f32.c``) runs vectorised here: AVX-512, or
    AVX2 with FMA and F16C (its two-half path, the same bits). Elsewhere its plain C loops are slower
    than PyTorch's GEMMs (``cpu/plan.py``)."""
    return cpu_has_avx512f() or cpu_has_avx2_fma_f16c()


def cpu_has_avx512_vnni() -> bool:
    """True when the int8 rows kernel's fast path (512-bit ``vpdpbusd``) runs here."""
    return {"avx512f", "avx512_vnni"} <= cpu_flags()


def cpu_has_bfloat16_products() -> bool:
    """True when the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): a bfloat16 product is then
    faster than a float32 one, not emulated."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_has_avx512_bf16() -> bool:
    """True when the bfloat16 rows kernel's dot product (512-bit ``vdpbf16ps``) runs here."""
    return {"avx512f", "avx512_bf16"} <= cpu_flags()
