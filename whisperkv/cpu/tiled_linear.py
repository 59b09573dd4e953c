"""The int8 type's bfloat16 encoder linears in AMX's bfloat16 tiles (``kernels/encoder_linear.c``), each
with what follows it: its bias, then GELU (the MLP's first linear) or the residual add (the attention's
output projection, the MLP's second); and its two convolutions the same way (``EncoderFrontTiles``).

Why: through PyTorch each of those linears is three passes over a 1,500-row output (the bias copied in,
oneDNN's product added to it, GELU or the add as another pass), each into freshly allocated memory. The
kernel finishes every 32 x 32 block of the output while its products are still in the cache, with
PyTorch's roundings to bfloat16 in PyTorch's order (bias, then GELU or the add), so the output is
PyTorch's but where a sum in another order rounds the other way, or GELU's far negative tail does (its
erf is not PyTorch's). Its slow twin is the PyTorch block (``use_attention_kernels(model,
linears=False)``); the tests hold the two to each other, the encoder's output to float32's, and the
int8 type's words are measured (``benchmarks/bench.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from whisperkv.model.attention import heads

if TYPE_CHECKING:
    from whisperkv.model.encoder import AudioEncoder, EncoderBlock

BIAS, GELU, RESIDUAL, GELU_RESIDUAL = 0, 1, 2, 3  # the kernel's epilogues
BLOCK = 32  # the kernel's output block: in and out features must be multiples of it


@dataclass(frozen=True)
class PackedLinear:
    """One linear's weight [out, in] in the tiles' layout [out/16][in/32][16 pairs][16][2], and its bias
    as float32 (its bfloat16 values, exactly)."""

    weight: torch.Tensor
    bias: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear:
        n, k = weight.shape
        packed = weight.detach().reshape(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()
        bias32 = torch.zeros(n) if bias is None else bias.detach().float()
        return cls(packed, bias32.contiguous(), n, k)

    def unpacked(self) -> torch.Tensor:
        """The weight [out, in] as it was given, exactly (a new tensor)."""
        return self.weight.permute(0, 3, 1, 2, 4).reshape(self.out_features, self.in_features)


class Int8Layer(Protocol):
    """An int8 linear packed for the int8 tiles (``cpu/int8_tiles.py``'s ``Int8TileLinear``)."""

    packed: torch.Tensor
    scales: torch.Tensor
    row_sums: torch.Tensor
    bias: torch.Tensor
    in_features: int
    out_features: int


Layer = PackedLinear | Int8Layer


class TiledEncoderLinear:
    """``epilogue(x @ weight.T + bias)`` for bfloat16 rows, where the kernels' library was built with AMX
    and Linux lends the tiles."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._fn = library.wkv_encoder_linear_bf16
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 3 + [ctypes.c_void_p, ctypes.c_long]
        self._fn.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_long]
        self._fn.argtypes += [ctypes.c_void_p, ctypes.c_long]
        #: the same product with int8 weights (``cpu/int8_tiles.py``): their scales and row sums besides
        self._int8 = library.wkv_encoder_linear_int8
        self._int8.restype = ctypes.c_int
        self._int8.argtypes = (
            [ctypes.c_void_p] + [ctypes.c_long] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_long]
        )
        self._int8.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_long]
        self._int8.argtypes += [ctypes.c_void_p, ctypes.c_long]

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether this library has the tile path (built with AMX) and this process may use the tiles."""
        return bool(library.wkv_encoder_linear_available())

    @staticmethod
    def int8_available(library: ctypes.CDLL) -> bool:
        """Whether this library has the int8 tile path (built with AMX-INT8) and the tiles are lent."""
        return bool(library.wkv_encoder_linear_int8_available())

    def __deepcopy__(self, memo: dict) -> TiledEncoderLinear:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (_reload, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(linear: nn.Linear) -> bool:
        """A bfloat16 linear whose shapes the kernel's 32 x 32 blocks divide."""
        if not isinstance(linear, nn.Linear):
            return False  # an int8 one (``cpu/int8_tiles.py``)
        n, k = linear.weight.shape
        return linear.weight.dtype == torch.bfloat16 and n % BLOCK == 0 and k % BLOCK == 0

    def __call__(
        self,
        x: torch.Tensor,
        layer: Layer,
        epilogue: int = BIAS,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [..., in] (bfloat16, rows evenly spaced, overlapping or not) → [..., out], into ``out``
        when given (rows evenly spaced); ``residual`` [..., out] with ``RESIDUAL`` and ``GELU_RESIDUAL``.
        ``layer`` bfloat16 (``PackedLinear``) or int8 (``cpu/int8_tiles.py``: ``in`` a multiple of 64)."""
        if x.dtype != torch.bfloat16 or x.shape[-1] != layer.in_features:
            shape = f"bfloat16 [..., {layer.in_features}], not {x.dtype} {tuple(x.shape)}"
            raise ValueError(f"the tiled linear takes {shape}")
        rows = x.reshape(-1, layer.in_features)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        shape = (*x.shape[:-1], layer.out_features)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16)
        elif out.shape != shape or out.dtype != torch.bfloat16 or out.stride(-1) != 1:
            raise ValueError(f"the output must be bfloat16 {shape} with unit column stride")
        target = out.view(-1, layer.out_features)
        res, res_stride = None, 0
        if epilogue in (RESIDUAL, GELU_RESIDUAL):
            if residual is None or residual.shape != out.shape or residual.dtype != torch.bfloat16:
                raise ValueError("the residual must be bfloat16 and shaped like the output")
            res = residual.reshape(-1, layer.out_features)
            res = res if res.stride(1) == 1 else res.contiguous()
            res_stride = res.stride(0)
        rest = (res_stride, target.data_ptr(), target.stride(0))
        if isinstance(layer, PackedLinear):
            done = self._fn(
                rows.data_ptr(), rows.shape[0], layer.in_features, rows.stride(0), layer.weight.data_ptr(),
                layer.out_features, layer.bias.data_ptr(), epilogue, None if res is None else res.data_ptr(),
                *rest,
            )  # fmt: skip
        else:
            done = self._int8(
                rows.data_ptr(), rows.shape[0], layer.in_features, rows.stride(0), layer.packed.data_ptr(),
                layer.scales.data_ptr(), layer.row_sums.data_ptr(), layer.out_features, layer.bias.data_ptr(),
                epilogue, None if res is None else res.data_ptr(), *rest,
            )  # fmt: skip
        if done != 1:
            raise RuntimeError(f"the tiled encoder linear failed (status {done}: no tiles or no memory)")
        return out

    def block(
        self, block: EncoderBlock, x: torch.Tensor, qkv: Layer, out: Layer, fc1: Layer, fc2: Layer
    ) -> torch.Tensor:
        """``EncoderBlock.forward`` with these four layers through the tiles, its LayerNorms and attention
        as they are."""
        attn = block.attn
        q, k, v = self(block.attn_ln(x), qkv).chunk(3, dim=-1)
        attended = attn.attention(q, heads(k, attn.n_head), heads(v, attn.n_head))
        x = self(attended, out, RESIDUAL, x)
        hidden = self(block.mlp_ln(x), fc1, GELU)
        return self(hidden, fc2, RESIDUAL, x)


class EncoderBlockTiles:
    """One encoder block's four linears packed for the tiles: ``forward`` is ``EncoderBlock.forward``'s
    fast twin (its LayerNorms and attention as they are). Packed again if a weight was replaced since.

    The packed weights are the block's only copy: its linears keep their shapes on the meta device (a
    computation with them fails, never runs on stale numbers) until ``restore`` gives them back, exactly,
    for another runner. Held twice, large-v3-turbo's encoder was 1.26 GB more in bfloat16. A weight
    changed in place while the tiles hold it is refused by name when they next pack or give it back."""

    def __init__(self, linear: TiledEncoderLinear, block: EncoderBlock) -> None:
        self.linear = linear
        self._pack(block)

    @staticmethod
    def takes(block: EncoderBlock) -> bool:
        return all(TiledEncoderLinear.takes(layer) for layer in _linears(block))

    def _sources(self, block: EncoderBlock) -> tuple:
        return _fingerprint(p for layer in _linears(block) for p in layer.parameters())

    def _pack(self, block: EncoderBlock) -> None:
        if hasattr(self, "qkv"):  # packed before: what these tiles hold goes back to the block first
            self.restore(block)
        weight, bias = block.attn.qkv_parameters()
        self.qkv = PackedLinear.of(weight, bias)
        self.out = PackedLinear.of(block.attn.out.weight, block.attn.out.bias)
        fc1, _, fc2 = block.mlp
        self.fc1 = PackedLinear.of(fc1.weight, fc1.bias)
        self.fc2 = PackedLinear.of(fc2.weight, fc2.bias)
        for layer in _linears(block):
            layer.weight = nn.Parameter(layer.weight.to("meta"), requires_grad=False)
        block.attn.qkv = None  # the fused projection (``fuse_qkv``) held them too
        if _state_from_tiles not in block._state_dict_hooks.values():
            block.register_state_dict_post_hook(_state_from_tiles)
        self.sources = self._sources(block)

    def weights(self) -> dict[str, torch.Tensor]:
        """The linears' weights these tiles hold, unpacked (new tensors), by their names in the block."""
        query, key, value = self.qkv.unpacked().split(self.out.in_features)
        rest = (layer.unpacked() for layer in (self.out, self.fc1, self.fc2))
        return dict(zip(LINEAR_NAMES, (query, key, value, *rest)))

    def restore(self, block: EncoderBlock) -> None:
        """Give the block back the weights these tiles hold (PyTorch's twin runs, or a plan packs again);
        a weight set on the block since is kept."""
        edited = [
            n
            for n, layer in zip(LINEAR_NAMES, _linears(block))
            if layer.weight.is_meta and layer.weight._version
        ]
        if edited:
            raise ValueError(
                f"the encoder's {', '.join(edited)} weight was changed in place while the AMX tiles held it "
                "(its only copy): give the weights back first (use_attention_kernels(model, linears=False)), "
                "change them, then plan again"
            )
        for layer, weight in zip(_linears(block), self.weights().values()):
            if layer.weight.is_meta:
                layer.weight = nn.Parameter(weight, requires_grad=False)
        attn = block.attn
        attn.fuse_qkv(attn._make_qkv)  # one [3d, d] matrix again, the three layers views of it

    def forward(self, block: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
        if self._sources(block) != self.sources:
            self._pack(block)
        return self.linear.block(block, x, self.qkv, self.out, self.fc1, self.fc2)


class EncoderFrontTiles:
    """The encoder's two convolutions (each with its GELU) and its positional embedding as tile products:
    the fast twin of ``AudioEncoder.forward``'s first lines (PyTorch's convolutions, its twin).

    A width-3 convolution over positions is a linear over three neighbouring positions' channels. Laid
    out position by position (a row a position, a zero row either side for the padding), position t's
    three neighbours are 3 x channels consecutive numbers from row t on, so the kernel reads the rows in
    place, overlapping, with no copy; the second convolution (stride 2) starts a row at every other
    position. The first writes its output in that layout, straight into the second's input; the second
    adds the positional embedding as it finishes. Packed again if a weight changed since."""

    def __init__(self, linear: TiledEncoderLinear, encoder: AudioEncoder) -> None:
        self.linear = linear
        self._pack(encoder)

    @staticmethod
    def takes(encoder: AudioEncoder) -> bool:
        conv1, conv2 = encoder.conv1, encoder.conv2
        return (
            conv1.weight.dtype == conv2.weight.dtype == torch.bfloat16
            and conv1.kernel_size == conv2.kernel_size == (3,)
            and conv1.padding == conv2.padding == (1,)
            and (conv1.stride, conv2.stride) == ((1,), (2,))
            and conv1.out_channels % BLOCK == 0
        )

    def _sources(self, encoder: AudioEncoder) -> tuple:
        return _fingerprint(
            [*encoder.conv1.parameters(), *encoder.conv2.parameters(), encoder.positional_embedding]
        )

    def _pack(self, encoder: AudioEncoder) -> None:
        conv1, conv2 = encoder.conv1, encoder.conv2
        width, mels = conv1.out_channels, conv1.in_channels
        self.mels, self.width = mels, width
        self.lanes = -(-mels // BLOCK) * BLOCK  # the Mel rows' channels padded to a multiple of 32
        weight1 = conv1.weight.new_zeros(width, 3, self.lanes)
        weight1[:, :, :mels] = conv1.weight.detach().permute(0, 2, 1)  # [out, neighbour, channel]
        self.conv1 = PackedLinear.of(weight1.reshape(width, 3 * self.lanes), conv1.bias)
        self.conv2 = PackedLinear.of(
            conv2.weight.detach().permute(0, 2, 1).reshape(width, 3 * width), conv2.bias
        )
        self.positions = encoder.positional_embedding.to(torch.bfloat16).contiguous()  # as the twin adds it
        self.sources = self._sources(encoder)

    def accepts(self, mel: torch.Tensor) -> bool:
        """bfloat16 log-Mel windows [B, mels, 2 x positions] (others go the twin's way, and its errors)."""
        return (
            mel.dtype == torch.bfloat16
            and mel.dim() == 3
            and mel.shape[1] == self.mels
            and mel.shape[2] == 2 * self.positions.shape[0]
        )

    def forward(self, encoder: AudioEncoder, mel: torch.Tensor) -> torch.Tensor:
        """[B, mels, frames] → [B, frames / 2, width]: GELU(conv2(GELU(conv1(mel)))) + positions."""
        if self._sources(encoder) != self.sources:
            self._pack(encoder)
        windows, _, frames = mel.shape
        lanes, width = self.lanes, self.width
        padded = mel.new_zeros(windows, frames + 2, lanes)
        padded[:, 1:-1, : self.mels] = mel.transpose(1, 2)
        hidden = mel.new_empty(windows, frames + 2, width)  # conv1's output, a zero row either side
        hidden[:, 0].zero_()
        hidden[:, -1].zero_()
        out = mel.new_empty(windows, frames // 2, width)
        for w in range(windows):  # the positional embedding is each window's
            rows = padded[w].as_strided((frames, 3 * lanes), (lanes, 1))
            self.linear(rows, self.conv1, GELU, out=hidden[w, 1:-1])
            rows = hidden[w].as_strided((frames // 2, 3 * width), (2 * width, 1))
            self.linear(rows, self.conv2, GELU_RESIDUAL, self.positions, out=out[w])
        return out


def _fingerprint(tensors: Iterable[torch.Tensor]) -> tuple:
    """What a packed copy was made from: each tensor's memory and in-place version (both tile classes
    pack again when it changes)."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def _state_from_tiles(block: nn.Module, state: dict, prefix: str, metadata: dict) -> None:
    """``state_dict()`` of a block whose linears the tiles hold: their weights unpacked, so a model saved
    or compared is its numbers, not meta shapes."""
    tiles = getattr(block, "tiles", None)
    if isinstance(tiles, EncoderBlockTiles):
        for name, weight in tiles.weights().items():
            key = f"{prefix}{name}.weight"
            if key in state and state[key].is_meta:
                state[key] = weight


LINEAR_NAMES = ("attn.query", "attn.key", "attn.value", "attn.out", "mlp.0", "mlp.2")  # as ``_linears``


def _linears(block: EncoderBlock) -> tuple[nn.Linear, ...]:
    attn, (fc1, _, fc2) = block.attn, block.mlp
    return attn.query, attn.key, attn.value, attn.out, fc1, fc2


def _reload() -> TiledEncoderLinear:
    from whisperkv.cpu.attend import load_kernel

    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C kernels could not be built in this process")
    return TiledEncoderLinear(kernel.library)
