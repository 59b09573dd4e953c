"""The int8 compute type's decoder linears through a small C kernel (``kernels/int8_rows.c``).

Why: a decoder step multiplies a few rows by every weight matrix once, with the weights not in the CPU
cache (the step's other reads push them out). PyTorch's quantized linear (fbgemm) is made for many
rows: ``benchmarks/int8_kernels.py --rows`` prints both, a call at a time, warm and cold. The kernel
quantises each row on its own and reads weights stored for the CPU's int8 dot product (16 output rows
x 4 inputs a line), so one row's numbers never depend on the others in the step.

Where the CPU has AMX and the system lets the process use its tiles, calls of a few rows or more (a
beam-5 step, a batch of windows) multiply through AMX's int8 tiles instead of VNNI's dot products: the
same integer sums, so the same bits (tested); ``amx`` says which this process gets.

Built with the attention kernel into one library (``cpu/attend.py``). Without AVX512-VNNI but with
AVX2 the same layout multiplies through 16-bit products (``kernels/int8_avx2.h``): the same integer
sums, the same bits; a step's few rows gain (tiny.en, an engine step of one row on a 2-core AMD EPYC
Zen 3: 4.3 ms with fbgemm, 1.6 ms through it), a window's 1,500 do not (``cpu/quantize.py``:
``encoder_choice``). No compiler, or neither, no kernel, and ``Int8Linear`` keeps fbgemm.
"""

from __future__ import annotations

import ctypes

import torch

from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.flags import cpu_has_avx2, cpu_has_avx512_vnni

LANES = 16  # output rows per packed block (LANES in int8_rows.c)
MAX_IN = 5120  # widest input it takes (MAXIN)


class Int8RowsKernel:
    """``pack`` int8 weights once; then ``y = x Wᵀ + b`` for any number of float32 rows."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rows = library.wkv_int8_rows
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 5
        self._pack = library.wkv_int8_pack
        self._pack.restype = None
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        # products of several rows through AMX's tiles (not in a library built from an int8_rows.c before
        # round 17: ``benchmarks/int8_kernels.py --against``)
        self.amx = hasattr(library, "wkv_int8_rows_amx") and bool(library.wkv_int8_rows_amx())

    def __deepcopy__(self, memo: dict) -> Int8RowsKernel:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_rows_kernel, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(in_features: int) -> bool:
        return 4 <= in_features <= MAX_IN and in_features % 4 == 0

    def pack(self, qweight: torch.Tensor) -> torch.Tensor:
        """int8 [out, in] → the kernel's layout, [ceil(out / 16) * 16 * in] int8 (padding rows are 0)."""
        out, width = qweight.shape
        if qweight.dtype != torch.int8 or not self.takes(width):
            raise ValueError(
                f"the int8 rows kernel takes int8 weights 4..{MAX_IN} wide in fours, not {width}"
            )
        qweight = qweight.contiguous()
        packed = torch.empty(-(-out // LANES) * LANES * width, dtype=torch.int8)
        self._pack(qweight.data_ptr(), out, width, packed.data_ptr())
        return packed

    def __call__(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        row_sum: torch.Tensor,
        bias: torch.Tensor | None,
        out_features: int,
    ) -> torch.Tensor:
        """``x`` [..., in] float32 → [..., out_features] float32."""
        width = x.shape[-1]
        rows = x.reshape(-1, width)
        y = self._run(rows, packed, scale, row_sum, bias, out_features)
        return y.reshape(*x.shape[:-1], out_features)

    def _run(
        self,
        rows: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        row_sum: torch.Tensor,
        bias: torch.Tensor | None,
        out_features: int,
    ) -> torch.Tensor:
        width = rows.shape[-1]
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        y = torch.empty(rows.shape[0], out_features, dtype=torch.float32)
        if rows.shape[0]:
            failed = self._rows(
                rows.data_ptr(),
                rows.stride(0),
                rows.shape[0],
                width,
                out_features,
                packed.data_ptr(),
                scale.data_ptr(),
                row_sum.data_ptr(),
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
            )
            if failed:
                raise ValueError(f"the int8 rows kernel does not take inputs {width} wide")
        return y


def load_rows_kernel() -> Int8RowsKernel | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built, or where the
    CPU has neither AVX512-VNNI nor AVX2 (``kernels/int8_avx2.h``): there its plain C loops give the
    same bits but are slower than fbgemm (46 against 19 µs for a 1152 x 384 product of one row, 1.4
    against 0.08 ms at 40 rows), so ``Int8Linear`` keeps fbgemm."""
    if not (cpu_has_avx512_vnni() or cpu_has_avx2()):
        return None
    built = load_kernel()
    return Int8RowsKernel(built.library) if built is not None else None
