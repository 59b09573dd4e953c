"""Decoder steps' attention: a small C kernel (``kernels/attend.c``), and which attention a model runs.

Why: a decoder step attends 1-16 new rows per window (one per beam) over up to 1,500 cached positions.
``scaled_dot_product_attention`` runs that through a blocked flash kernel made for long queries; the
kernel here makes one pass over each head's keys and one over its values for all the window's rows.
``benchmarks/attend_kernel.py`` on this project's 2-core VM (tiny.en shapes, caches not in the CPU
cache): one query over a window's Cross-KV 180 µs against 244, five queries (beam 5) 254 against 478,
five windows of five beams (batched mode) 1,121 against 2,353.

Both CPU compute types use it (``use_attention_kernels``, below): the int8 type since round 6, float32
since round 9. Its sums run in another order than SDPA's, so its outputs differ in the last bits
(2-5e-7), as the float32 row GEMMs' do (``model/row_gemm.py``): float32 transcripts stay the
reference's token for token (parity tests, ``verify``, and SDPA kept as the kernel's slow twin in the
tests). Measured in one process, interleaved, tiny.en float32 on 120 s of utterances (scratch): greedy
4.08 against 4.29 s, beam 5 6.31 against 7.21 s, the same tokens; base 7.42 / 7.78 and 10.40 / 10.93.

Why built here, on first use: ``-march=native`` for the CPU it runs on, and a C compiler is all it
needs (no Python headers). The library holds the int8 linears' kernel too (``kernels/int8_rows.c``,
``model/int8_rows.py``), and the float32 step's (``kernels/rows_f32.c``, ``model/step_rows.py``): one
build, one cache entry. It is kept in a cache directory under a name that
hashes the sources, the flags and the CPU, so one build serves every later process. A machine without
a compiler keeps SDPA (and fbgemm): ``TextDecoder.attention_kernel`` says which one a model uses. It
links the OpenMP runtime PyTorch has already loaded (``libgomp.so.1``): one thread pool,
``torch.set_num_threads`` applies.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from whisperkv.model.attention import HeadByHeadAttention
from whisperkv.model.cpu_flags import cpu_flags, cpu_has_amx_bf16
from whisperkv.model.tiled_attention import TiledEncoderAttention
from whisperkv.model.tiled_linear import EncoderBlockTiles, EncoderFrontTiles, TiledEncoderLinear

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

#: compiled together into one library: the step attention, the int8 linears' rows (``model/int8_rows.py``),
#: beam search's top k (``decoding/top_k.py``), the vocabulary screen's candidates
#: (``model/vocab_screen.py``), the float32 step's linears (``model/step_rows.py``) and a block's whole
#: step (``model/block_step.py``), and the int8 type's (``model/int8_step.py``), and the beam step's
#: Self-KV reorder (``cache/reorder.py``), and the int8 type's encoder attention in AMX tiles
#: (``model/tiled_attention.py``) and linears (``model/tiled_linear.py``), and a greedy step's filters
#: and token choice (``decoding/greedy_choice.py``)
SOURCES = tuple(
    Path(__file__).with_name("kernels") / name
    for name in ("attend.c", "int8_rows.c", "top_k.c", "screen.c", "rows_f32.c", "block_step.c")
    + ("int8_block_step.c", "reorder.c", "encoder_attend.c", "encoder_linear.c", "greedy_choice.c")
)
#: what the sources include: part of the built library's name, so a change to it rebuilds
HEADERS = tuple(Path(__file__).with_name("kernels") / name for name in ("amx.h", "avx512_math.h"))
#: ``-mprefer-vector-width=512``: gcc vectorises the plain C loops (a softmax's sums, the twins' dot
#: products) 512 bits wide on every AVX-512 CPU. Without it the width followed what ``-march=native``
#: named the CPU: a VM whose CPU gcc 12 took for a Rocket Lake got 256-bit loops (its tuning), one it did
#: not know got 512 (the generic tuning), and the attention kernel's register loops, written in the
#: order of the 512-bit plain loops, no longer gave their bits on the first (round 21).
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC", "-shared")
HEAD = 64  # every Whisper model's head width
MAX_ROWS = 16  # query rows per window the kernel takes (MAXQ in attend.c)
MAX_POSITIONS = 1500  # cached positions it attends over (MAXT): the audio context, the text one is 448


class AttendKernel:
    """``attend`` for one new position per row, head width 64, float32 queries over float32 or bfloat16
    caches: the C kernel, or not at all."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.library = library  # also holds the int8 linears' kernel (``model/int8_rows.py``)
        #: the version for each dtype the caches may be held in (queries and output stay float32)
        self._fns = {torch.float32: library.wkv_attend, torch.bfloat16: library.wkv_attend_bf16}
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 3 + [ctypes.c_long] * 10
            fn.argtypes += [ctypes.c_float]

    def __deepcopy__(self, memo: dict) -> AttendKernel:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_kernel, ())  # another process loads (or builds) its own

    def accepts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> bool:
        """Whether ``q`` [B, 1, d] (float32) over ``k``/``v`` [Bk, H, T, 64] (float32 or bfloat16) is a
        step this kernel computes.

        One query position per row needs no mask: a new position sees every key held, its own included.
        Beams share their window's keys (B a multiple of Bk) only where there is no mask (cross-attention).
        """
        if q.dim() != 3 or q.shape[1] != 1 or k.dim() != 4 or k.shape[-1] != HEAD:
            return False
        if not 1 <= k.shape[2] <= MAX_POSITIONS:
            return False
        if q.dtype != torch.float32 or k.dtype not in self._fns or v.dtype != k.dtype:
            return False
        if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
            return False
        b, bk = q.shape[0], k.shape[0]
        if b % bk or not 1 <= b // bk <= MAX_ROWS or (causal_offset is not None and b != bk):
            return False
        return q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and v.shape == k.shape

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Softmax(q kᵀ / 8) v per head: [B, 1, d] like ``attention.attend`` (call ``accepts`` first)."""
        bk, n_head, positions, _ = k.shape
        out = torch.empty(q.shape[0], 1, q.shape[2], dtype=torch.float32)
        failed = self._fns[k.dtype](
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            v.data_ptr(),
            out.data_ptr(),
            bk,
            q.shape[0] // bk,
            n_head,
            positions,
            *k.stride()[:3],
            *v.stride()[:3],
            HEAD**-0.5,
        )
        if failed:  # ``accepts`` keeps this from happening
            raise ValueError(f"the attention kernel does not take {tuple(q.shape)} over {tuple(k.shape)}")
        return out


def cache_dir() -> Path:
    """Where built kernels are kept: ``$WHISPERKV_CACHE``, else ``$XDG_CACHE_HOME/whisperkv``."""
    if os.environ.get("WHISPERKV_CACHE"):
        return Path(os.environ["WHISPERKV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whisperkv"


def _cpu_id() -> str:
    return " ".join(sorted(cpu_flags()))  # the flags -march=native builds for


@functools.cache
def load_kernel(directory: Path | None = None) -> AttendKernel | None:
    """The built kernel for this CPU (built now if it is not in ``directory`` yet), or None when no C
    compiler is found or the build fails (with a warning): the caller then keeps SDPA.

    Without ``directory``: the cache directory, or the system's temporary one where that cannot be
    written (a read-only home)."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None or not all(source.is_file() for source in SOURCES + HEADERS):
        return None
    sources = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    key = hashlib.sha256(sources + " ".join(FLAGS).encode() + _cpu_id().encode() + compiler.encode())
    name = f"kernels-{key.hexdigest()[:16]}.so"
    places = (
        [directory] if directory else [cache_dir(), Path(tempfile.gettempdir()) / f"whisperkv-{os.getuid()}"]
    )
    failure = ""
    for place in places:
        try:
            return AttendKernel(ctypes.CDLL(str(_build(compiler, place / name))), place / name)
        except subprocess.CalledProcessError as err:  # the compiler refused: another place will not help
            lines = err.stderr.decode(errors="replace").strip().splitlines()
            failure = lines[-1] if lines else f"{Path(compiler).name} exited with status {err.returncode}"
            break
        except (OSError, subprocess.SubprocessError) as err:
            failure = str(err)
    warnings.warn(
        f"the C kernels (decoder steps' attention, float32 and int8 linears, beam search's top k, the "
        f"vocabulary screen's candidates) were not built ({failure}); using PyTorch's attention, row "
        f"GEMMs, quantized linears, topk and tensor operations",
        stacklevel=2,
    )
    return None


def _build(compiler: str, path: Path) -> Path:
    """``path``, compiled now unless it is there already; atomic, so a concurrent build is harmless."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            built = Path(tmp) / path.name
            subprocess.run(
                [compiler, *FLAGS, *map(str, SOURCES), "-o", str(built), "-lm"],
                check=True,
                capture_output=True,
                timeout=120,
            )
            os.replace(built, path)
    return path


ATTENTION_MARK = "+attention("  # which attention made a model's numbers, in its weights digest


def use_attention_kernels(
    model: Whisper,
    on: bool = True,
    bfloat16_caches: bool = True,
    rows: bool = True,
    head_by_head: bool | None = None,
    tiles: bool = True,
    linears: bool = True,
) -> None:
    """A model's own attention (``on``) or PyTorch's SDPA everywhere (``on=False``).

    Decoder steps attend through the C kernel where it builds, for both CPU compute types: float32
    (``load_model`` turns it on) and int8. The int8 type also holds its Self-KV and Cross-KV in
    bfloat16 (``bfloat16_caches``, round 7: a step reads every cached key and value once, so half the
    bytes is most of its attention's time; SDPA was slower over bfloat16 caches, 294 against 110 us a
    call, so without the kernel they stay float32), and runs a bfloat16 encoder head by head
    (``attention.HeadByHeadAttention``) where the CPU lacks AMX (with AMX, SDPA's bfloat16 path was
    faster: 62-73 against 85-117 ms a window, round 15; ``head_by_head`` True or False chooses). With
    AMX it runs in the kernels' bfloat16 tiles (``model/tiled_attention.py``, round 18) unless ``tiles``
    is False (then SDPA, its twin), and so do its linears with their bias, GELU and residual add
    (``model/tiled_linear.py``, round 19) unless ``linears`` or ``tiles`` is False (then PyTorch's, their
    twin). The float32 encoder keeps SDPA and PyTorch's linears.

    The kernel's sums run in another order than SDPA's (outputs 2-5e-7 apart), as the row GEMMs' do
    (``model/row_gemm.py``): float32 transcripts stay the reference's token for token (the parity tests,
    ``verify``, and a test of the kernel against SDPA on the same model). The choice changes the
    model's numbers, so it is part of the weights digest every cache's provenance carries: an encoder
    output or a cache made one way is never taken for one made the other way (across the trust
    boundary, too). A float32 model with SDPA keeps its plain digest.

    ``rows`` (float32, with the kernel): each linear of a decoder step, with its LayerNorm, bias, GELU and
    residual, in one C call (``model/step_rows.py``); ``rows=False`` keeps the row GEMMs, its slow twin.
    The digest names it too ("linears kernel"; "final norm kernel": the LayerNorm before the vocabulary
    is the kernel's too, ``TextDecoder._logits``)."""
    int8 = model.compute_type == "int8"
    if not int8 and (model.device.type != "cpu" or model.dtype != torch.float32):
        raise ValueError(
            f"the attention kernel is for float32 and int8 models on the CPU, not {model.dtype} "
            f"on {model.device.type}"
        )
    digest = model.weights_digest.split(ATTENTION_MARK)[0]  # of the weights as loaded (float32)
    kernel = load_kernel() if on else None
    for block in model.decoder.blocks:
        block.attn.kernel = block.cross_attn.kernel = kernel
    step_rows = None
    if not int8:  # the float32 step's linears and vocabulary: the same library, or the row GEMMs
        from whisperkv.model.step_rows import use_step_rows

        step_rows = use_step_rows(model.decoder, on=kernel is not None and rows)
    else:  # the int8 type's own step kernels (``model/int8_step.py``), or PyTorch between its kernels
        from whisperkv.model.int8_step import use_int8_step

        step_rows = use_int8_step(model.decoder, on=kernel is not None and rows)
    caches = int8 and kernel is not None and bfloat16_caches
    model.decoder.kv_dtype = torch.bfloat16 if caches else None
    # the bfloat16 encoder in AMX's tiles where the CPU has them (else SDPA's bfloat16 path, faster there
    # than head by head), head by head where it has not
    if head_by_head is None:
        head_by_head = not cpu_has_amx_bf16()
    bfloat16_encoder = int8 and on and model.encoder_dtype == torch.bfloat16
    head_by_head = bfloat16_encoder and head_by_head
    tiled = bfloat16_encoder and not head_by_head and tiles and kernel is not None
    tiled = tiled and TiledEncoderAttention.available(kernel.library)
    encoder_attention = (
        TiledEncoderAttention(kernel.library) if tiled else HeadByHeadAttention() if head_by_head else None
    )
    linears = tiled and linears and TiledEncoderLinear.available(kernel.library)
    linears = linears and all(EncoderBlockTiles.takes(block) for block in model.encoder.blocks)
    front = linears and EncoderFrontTiles.takes(model.encoder)
    tiled_linear = TiledEncoderLinear(kernel.library) if linears else None
    for block in model.encoder.blocks:
        block.attn.kernel = encoder_attention
        block.tiles = EncoderBlockTiles(tiled_linear, block) if tiled_linear else None
    model.encoder.front = EncoderFrontTiles(tiled_linear, model.encoder) if tiled_linear and front else None
    if not int8 and kernel is None:
        model.__dict__["weights_digest"] = digest  # SDPA: the reference's own attention
        return
    decoder = ("kernel, bfloat16 caches" if caches else "kernel") if kernel else "sdpa"
    decoder += ", linears kernel" if step_rows is not None else ""
    # the step kernel's final LayerNorm is its own (round 21; PyTorch's before): other numbers
    decoder += ", final norm kernel" if step_rows is not None else ""
    encoder = "amx tiles" if tiled else "head-by-head" if head_by_head else "sdpa"
    encoder += ", linears tiles" if linears else ""
    encoder += ", convolutions tiles" if front else ""
    model.__dict__["weights_digest"] = f"{digest}{ATTENTION_MARK}decoder {decoder}, encoder {encoder})"
