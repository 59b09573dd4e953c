"""The CPU backend's step plan: which of its kernels run a model's steps, chosen once at load.

``use_attention_kernels`` decides (from the compute type, the CPU and whether the kernels' library
built) and sets what it chose on the model: the attention kernel on each attention layer, the linears'
kernel and the one-call block step on each decoder block, the whole-step kernel on the decoder, the
encoder's AMX tiles; then it gives the decoder one ``CpuStepPlan``, the object the decoder calls
through (``model/decoder.py``: ``StepPlan``). Whatever the plan declines runs as the decoder's own
PyTorch, the reference twin. The choice changes the model's numbers, so it is named in the weights
digest every cache's provenance carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from whisperkv.cpu import reorder as layer_reorder
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.bf16_step import Bf16StepRows, use_bf16_step
from whisperkv.cpu.dot_attention import DotEncoderAttention
from whisperkv.cpu.flags import cpu_has_amx_bf16, cpu_has_bfloat16_products, cpu_has_vector_rows
from whisperkv.cpu.head_by_head import HeadByHeadAttention
from whisperkv.cpu.int8_decoder_step import use_int8_step
from whisperkv.cpu.int8_encoder import Bfloat16Front, Int8EncoderBlock
from whisperkv.cpu.int8_step import Int8StepRows, load_int8_step_rows
from whisperkv.cpu.int8_tiles import EncoderBlockInt8Tiles
from whisperkv.cpu.int16_attention import Int16EncoderAttention
from whisperkv.cpu.step_rows import StepRowsKernel, use_step_rows
from whisperkv.cpu.tiled_attention import TiledEncoderAttention
from whisperkv.cpu.tiled_linear import EncoderBlockTiles, EncoderFrontTiles, TiledEncoderLinear
from whisperkv.cpu.vocab import ChunkedRowProjection
from whisperkv.model.attention import heads

if TYPE_CHECKING:
    from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
    from whisperkv.model.decoder import DecoderBlock, TextDecoder
    from whisperkv.model.whisper import Whisper

ATTENTION_MARK = "+attention("  # which attention made a model's numbers, in its weights digest
#: positions per row from which a float32 prompt's linears are PyTorch's (MKL's GEMMs), not the rows
#: kernel's: fixed, never timed, so a prompt's numbers depend only on its length
PROMPT_POSITIONS = 32


class CpuStepPlan:
    """The decoder's steps through the kernels set on its modules (``use_attention_kernels``): each
    block's linears in one C call each (``block.step_rows``: ``cpu/step_rows.py``, ``cpu/int8_step.py``),
    a lone cache's block in one call (``block.block_step``), a lone cache's whole step
    (``decoder.decoder_step``), the final LayerNorm inside the vocabulary's call, and the beam step's
    Self-KV reorder (``cpu/reorder.py``). Float32 CPU rows only: other rows are declined (None)."""

    def block(
        self,
        block: DecoderBlock,
        x: torch.Tensor,
        sizes: list[int],
        self_kvs: list[SelfKV],
        cross_kvs: list[CrossKV],
    ) -> torch.Tensor | None:
        """``forward_rows`` with six C calls for the linears, each over all B x T positions as rows (or
        one call for the whole block, where a lone cache's step takes it). A float32 prompt of
        ``PROMPT_POSITIONS`` or more is declined: its rows are a GEMM's work, which MKL does faster than
        the rows kernel's dot products (tiny.en, 2-core AMD EPYC Zen 1, ``benchmarks/prompt_rows.py``: a
        prompt of 225 tokens 68 against 118 ms, 32 tokens 18 against 19, 16 tokens 14 against 12)."""
        rows = getattr(block, "step_rows", None)
        if rows is None or x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        if x.shape[1] >= PROMPT_POSITIONS and isinstance(rows, StepRowsKernel):
            return None  # DecoderBlock.forward: PyTorch's linears, as the uncached twin's
        step = getattr(block, "block_step", None)
        if step is not None and step.takes(block, x, sizes, self_kvs[0], cross_kvs[0]):
            return step(block, x, self_kvs[0], cross_kvs[0])  # the same calls, from C
        b, t, d = x.shape
        x = x.reshape(b * t, d)
        attn, cross = block.attn, block.cross_attn
        qkv = rows.through(x, attn.qkv, norm=block.attn_ln).view(b, t, 3 * d)
        q, k, v = qkv[..., :d], heads(qkv[..., d : 2 * d], attn.n_head), heads(qkv[..., 2 * d :], attn.n_head)
        attended = block.attend_self(q, k, v, sizes, self_kvs).reshape(b * t, d)
        x = rows.through(attended, attn.out, residual=x)
        q = rows.through(x, cross.query, norm=block.cross_attn_ln).view(b, t, d)
        attended = block.attend_cross(q, sizes, cross_kvs).reshape(b * t, d)
        x = rows.through(attended, cross.out, residual=x)
        up, _, down = block.mlp
        hidden = rows.through(x, up, norm=block.mlp_ln, gelu=True)
        return rows.through(hidden, down, residual=x).view(b, t, d)

    def step(self, decoder: TextDecoder, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor | None:
        """A lone cache's whole step in one C call (``cpu/decoder_step.py``), where it takes it; without
        the step kernels, through the row GEMMs in one Python function (``cpu/gemm_step.py``)."""
        whole = getattr(decoder, "decoder_step", None)
        return None if whole is None else whole.logits(decoder, tokens, cache)

    def logits(self, decoder: TextDecoder, x: torch.Tensor, sizes: list[int] | None) -> torch.Tensor | None:
        """The final LayerNorm inside the vocabulary projection's call, as the one-call step makes it:
        the float32 type's table (rows-gemm layout) or the int8 or bfloat16 type's linear through the step's
        kernel."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        projection = decoder.logits_projection
        if isinstance(projection, ChunkedRowProjection):
            return projection(x, sizes, norm=decoder.ln) if projection.kernel is not None else None
        rows = getattr(decoder.blocks[0], "step_rows", None) if len(decoder.blocks) else None
        if not isinstance(rows, (Int8StepRows, Bf16StepRows)) or not rows.takes(projection):
            return None
        flat = x.reshape(-1, x.shape[-1])
        return rows.through(flat, projection, norm=decoder.ln).view(*x.shape[:-1], -1)

    def reorder(self, self_kvs: list[SelfKV], moves: list[tuple[int, int]]) -> bool:
        """Every layer's Self-KV reordered in one C call, where it takes them."""
        if not layer_reorder.takes(self_kvs, self_kvs[0].buffers[0].shape[0] if self_kvs else 0):
            return False
        layer_reorder.reorder_layers(self_kvs, moves)
        return True

    def forget(self, decoder: TextDecoder) -> None:
        """The one-call block step's structs point at the blocks' tensors: they go before a move."""
        for block in decoder.blocks:
            step = getattr(block, "block_step", None)
            if step is not None:
                step.forget(block)


def use_attention_kernels(
    model: Whisper,
    on: bool = True,
    bfloat16_caches: bool = True,
    rows: bool | None = None,
    head_by_head: bool | None = None,
    tiles: bool = True,
    linears: bool = True,
) -> None:
    """A model's own attention (``on``) or PyTorch's SDPA everywhere (``on=False``).

    Decoder steps attend through the C kernel where it builds, for every CPU compute type: float32
    (``load_model`` turns it on), int8 and bfloat16 (``cpu/bfloat16.py``: everything said of the int8 type
    below holds for it, its linears being ``cpu/bf16_step.py``'s, its encoder's attention without AMX
    ``cpu/dot_attention.py``'s). The int8 type also holds its Self-KV and Cross-KV in bfloat16
    (``bfloat16_caches``, round 7: a step reads every cached key and value once, so half the bytes is most of
    its attention's time; SDPA was slower over bfloat16 caches, 294 against 110 us a call, so without the
    kernel they stay float32), and runs a bfloat16 encoder head by head (``attention.HeadByHeadAttention``)
    where the CPU lacks AMX (with AMX, SDPA's bfloat16 path was faster: 62-73 against 85-117 ms a window,
    round 15; ``head_by_head`` True or False chooses). With AMX it runs in the kernels' bfloat16 tiles
    (``cpu/tiled_attention.py``, round 18) unless ``tiles`` is False (then SDPA, its twin), and so do its
    linears with their bias, GELU and residual add (``cpu/tiled_linear.py``, round 19) unless ``linears`` or
    ``tiles`` is False (then PyTorch's, their twin); where the encoder's linears are int8 (AMX-INT8:
    ``cpu/int8_tiles.py``), in the int8 tiles the same way (their twin ``Int8TileLinear.forward``). Without
    native bfloat16 the int8 type's encoder is float32 between fbgemm's int8 linears: it attends in 16-bit
    integers through AVX2 (``cpu/int16_attention.py``) unless ``tiles`` is False (then SDPA, its twin). The
    float32 encoder keeps SDPA and PyTorch's linears.

    The kernel's sums run in another order than SDPA's (outputs 2-5e-7 apart), as the row GEMMs' do
    (``cpu/row_gemm.py``): float32 transcripts stay the reference's token for token (the parity tests,
    ``verify``, and a test of the kernel against SDPA on the same model). The choice changes the
    model's numbers, so it is part of the weights digest every cache's provenance carries: an encoder
    output or a cache made one way is never taken for one made the other way (across the trust
    boundary, too). A float32 model with SDPA keeps its plain digest.

    ``rows`` (float32, with the kernel): each linear of a decoder step, with its LayerNorm, bias, GELU and
    residual, in one C call (``cpu/step_rows.py``); ``rows=False`` keeps the row GEMMs, its slow twin.
    ``rows=None`` (the default) takes the kernel where it runs vectorised (AVX-512, or AVX2 with FMA and
    F16C: ``flags.cpu_has_vector_rows``); its plain C loops elsewhere are slower than the GEMMs (2-core
    AVX2 EPYC, tiny.en, an engine step of one row: 62 ms through the plain loops, 9.1 ms through the
    row GEMMs, 3.4 ms through the AVX2 path; ``benchmarks/profile_step.py``).
    The digest names it too ("linears kernel"; "final norm kernel": the LayerNorm before the vocabulary
    is the kernel's too, ``TextDecoder._logits``; "long prompts pytorch": a prompt of ``PROMPT_POSITIONS``
    or more is PyTorch's, ``CpuStepPlan.block``)."""
    int8, bf16 = model.compute_type == "int8", model.compute_type == "bfloat16"
    approx = int8 or bf16  # the approximate types (``cpu/quantize.py``, ``cpu/bfloat16.py``)
    if not approx and (model.device.type != "cpu" or model.dtype != torch.float32):
        raise ValueError(
            f"the attention kernel is for float32 and int8 models on the CPU, not {model.dtype} "
            f"on {model.device.type}"
        )
    digest = model.weights_digest.split(ATTENTION_MARK)[0]  # of the weights as loaded (float32)
    kernel = load_kernel() if on else None
    for block in model.decoder.blocks:
        block.attn.kernel = block.cross_attn.kernel = kernel
    # the step's linears and vocabulary: the kernels, or the row GEMMs (float32) / PyTorch between the
    # int8 kernels, their twins
    if rows is None:
        rows = approx or cpu_has_vector_rows()
    use = use_int8_step if int8 else use_bf16_step if bf16 else use_step_rows
    step_rows = use(model.decoder, on=kernel is not None and rows)
    caches = approx and kernel is not None and bfloat16_caches
    model.decoder.kv_dtype = torch.bfloat16 if caches else None
    model.decoder.plan = CpuStepPlan()
    encoder = _plan_encoder(model, kernel, approx and on, head_by_head, tiles, linears)
    if not approx and kernel is None:
        model.__dict__["weights_digest"] = digest  # SDPA: the reference's own attention
        return
    decoder = ("kernel, bfloat16 caches" if caches else "kernel") if kernel else "sdpa"
    # the step kernel's final LayerNorm is its own (round 21; PyTorch's before): other numbers
    decoder += ", linears kernel, final norm kernel" if step_rows is not None else ""
    # a float32 prompt of PROMPT_POSITIONS or more: PyTorch's linears (session 71; the kernel's before)
    decoder += ", long prompts pytorch" if isinstance(step_rows, StepRowsKernel) else ""
    model.__dict__["weights_digest"] = f"{digest}{ATTENTION_MARK}decoder {decoder}, encoder {encoder})"


def _plan_encoder(
    model: Whisper, kernel: object, int8_on: bool, head_by_head: bool | None, tiles: bool, linears: bool
) -> str:
    """The bfloat16 encoder (the int8 and bfloat16 types', ``int8_on``) in AMX's tiles where the CPU has
    them (else SDPA's bfloat16 path, faster there than head by head), head by head where it has not
    (the bfloat16 type's through AVX512-BF16's dot product in C where it can: ``_dot_kernel``); every
    other encoder keeps SDPA and PyTorch's linears. Returns what was chosen, for the digest."""
    if head_by_head is None:
        head_by_head = not cpu_has_amx_bf16()
    rows_on = tiles and linears and kernel is not None  # the int8 encoder's runners (twins: False)
    bfloat16_encoder = int8_on and model.encoder_dtype == torch.bfloat16
    # an int8 encoder (float32 between its int8 linears) attends in bfloat16 too where that is native
    int8_encoder = int8_on and not bfloat16_encoder and cpu_has_bfloat16_products() and head_by_head
    head_by_head = bfloat16_encoder and head_by_head
    tiled = bfloat16_encoder and not head_by_head and tiles and kernel is not None
    tiled = tiled and TiledEncoderAttention.available(kernel.library)
    # the int8 encoder's block runner hands its attention bfloat16 queries, keys and values laid out as
    # one projection (``Int8EncoderBlock``): the dot kernel takes them; its twin (``rows_on`` False)
    # goes head by head from float32; the int8 type's bfloat16 encoder (AMX's) asked to go head by head
    # goes so (its numbers as before the dot kernel)
    bfloat16_type = model.compute_type == "bfloat16"
    dot = ((head_by_head and bfloat16_type) or (int8_encoder and rows_on)) and _dot_kernel(
        model, kernel, tiles
    )
    # without native bfloat16 the int8 type's float32 encoder attends in 16-bit integers where AVX2 can
    int16 = int8_on and not (bfloat16_encoder or int8_encoder) and _int16_kernel(model, kernel, tiles)
    encoder_attention = (
        TiledEncoderAttention(kernel.library)
        if tiled
        else DotEncoderAttention(kernel.library)
        if dot
        else HeadByHeadAttention(from_float32=int8_encoder)
        if head_by_head or int8_encoder
        else Int16EncoderAttention(kernel.library)
        if int16
        else None
    )
    linears = tiled and linears and TiledEncoderLinear.available(kernel.library)
    tiled_linear = TiledEncoderLinear(kernel.library) if linears else None
    blocks = model.encoder.blocks
    # the int8 encoder's linears (``cpu/int8_tiles.py``) or the bfloat16 ones packed for the tiles
    int8_blocks = linears and all(EncoderBlockInt8Tiles.takes(block) for block in blocks)
    int8_blocks = int8_blocks and TiledEncoderLinear.int8_available(kernel.library)
    bf16_blocks = linears and not int8_blocks and all(EncoderBlockTiles.takes(block) for block in blocks)
    front = (int8_blocks or bf16_blocks) and EncoderFrontTiles.takes(model.encoder)
    for block in blocks:
        block.attn.kernel = encoder_attention
        if isinstance(block.tiles, EncoderBlockTiles):  # they hold its weights: given back first
            block.tiles.restore(block)
        runner = EncoderBlockInt8Tiles(tiled_linear) if int8_blocks else None
        block.tiles = EncoderBlockTiles(tiled_linear, block) if bf16_blocks else runner
    model.encoder.front = EncoderFrontTiles(tiled_linear, model.encoder) if front else None
    encoder = "amx tiles" if tiled else "dot kernel" if dot else "head-by-head" if head_by_head else "sdpa"
    encoder = "int16 kernel" if int16 else encoder
    encoder = ("dot kernel" if dot else "head-by-head bfloat16") if int8_encoder else encoder
    encoder += ", linears int8 tiles" if int8_blocks else ", linears tiles" if bf16_blocks else ""
    encoder += ", convolutions tiles" if front else ""
    if int8_on and not bfloat16_encoder:
        encoder += _plan_int8_encoder(model, rows_on)
    return encoder


def _plan_int8_encoder(model: Whisper, on: bool) -> str:
    """An int8 encoder whose linears the rows kernel holds: each with its LayerNorm, GELU and residual in
    one C call (``cpu/int8_encoder.py``), and its convolutions in bfloat16 where the CPU multiplies
    bfloat16 natively; with ``on`` False, PyTorch's block and float32 front (the twins)."""
    rows = load_int8_step_rows() if on else None
    blocks = rows is not None and all(Int8EncoderBlock.takes(block) for block in model.encoder.blocks)
    front = on and cpu_has_bfloat16_products()
    for block in model.encoder.blocks:
        block.tiles = Int8EncoderBlock(rows) if blocks else None
    model.encoder.front = Bfloat16Front(model.encoder) if front else None
    return (", linears rows kernel" if blocks else "") + (", convolutions bfloat16" if front else "")


def _int16_kernel(model: Whisper, kernel: object, tiles: bool) -> bool:
    """Whether the int8 type's float32 encoder (fbgemm's linears, a CPU without native bfloat16 products)
    attends in 16-bit integers through AVX2 in C (``cpu/int16_attention.py``): its own kernels on
    (``tiles``; False keeps SDPA, its twin), the library built with AVX2 and FMA. ~1.5x SDPA's speed."""
    return (
        model.compute_type == "int8"
        and tiles
        and kernel is not None
        and Int16EncoderAttention.available(kernel.library)
    )


def _dot_kernel(model: Whisper, kernel: object, tiles: bool) -> bool:
    """Whether the encoder (the bfloat16 type's, or the int8 type's with int8 linears) attends through
    AVX512-BF16's dot product in C (``cpu/dot_attention.py``) where it would go head by head: its own
    kernels on (``tiles``), the CPU and the library with AVX512-BF16. Closer to float32 than head by
    head (mean error 1.2e-3 against 7.8e-3, ``tests/test_dot_attention.py``) and faster."""
    return (
        model.compute_type in ("bfloat16", "int8")
        and tiles
        and kernel is not None
        and DotEncoderAttention.available(kernel.library)
    )
