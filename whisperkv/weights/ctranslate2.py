"""Read a CTranslate2 Whisper model directory (``model.bin`` + ``config.json`` + ``tokenizer.json``).

We parse ``model.bin`` ourselves instead of depending on the ctranslate2 runtime. Layout (binary
version 6, little endian): u32 version, string spec name, u32 spec revision, u32 variable count, then
per variable: string name, u8 rank, u32 dims[rank], u8 dtype, u32 byte count, raw bytes; then u32 alias
count and (alias, target) string pairs. A string is a u16 length (with the trailing NUL) and its bytes.

The file is memory-mapped, not read: each variable is a view into the map, converted to a float32
tensor one at a time, and the pages it came from are handed back to the kernel as soon as it is
converted. Loading tiny.en (75 MB of float16) then holds the 151 MB of float32 weights plus at most one
variable's pages, not the whole file beside them.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from whisperkv.errors import ModelLoadError
from whisperkv.model.dims import ModelDims
from whisperkv.weights.checkpoint import Checkpoint, directory_checkpoint, split_fused

# CTranslate2's DataType enum, in its declared order.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_DTYPE_NAMES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}


class _Reader:
    """Reads model.bin front to back across one or several buffers (a model split into parts)."""

    def __init__(self, parts: Sequence[bytes | mmap.mmap | memoryview], source: str) -> None:
        self.parts = [memoryview(p) for p in parts]
        self.starts = np.cumsum([0] + [len(p) for p in self.parts]).tolist()
        self.size, self.pos, self.source = self.starts[-1], 0, source

    def slice(self, start: int, n: int) -> memoryview:
        """``n`` bytes at ``start``: a view when they lie in one part, a copy of them when they span two."""
        if start + n > self.size:
            raise ModelLoadError(f"{self.source}: model.bin is truncated")
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        local = start - self.starts[i]
        if local + n <= len(self.parts[i]):
            return self.parts[i][local : local + n]
        out = bytearray()
        while len(out) < n:
            take = min(n - len(out), len(self.parts[i]) - local)
            out += self.parts[i][local : local + take]
            i, local = i + 1, 0
        return memoryview(bytes(out))

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        values = struct.unpack(fmt, self.slice(self.pos, size))
        self.pos += size
        return values

    def string(self) -> str:
        (length,) = self.take("<H")
        raw = bytes(self.slice(self.pos, length))
        self.pos += length
        return raw.rstrip(b"\0").decode("utf-8")


def read_model_bin(
    data: bytes | Sequence[bytes | mmap.mmap], source: str = "model.bin"
) -> tuple[dict[str, np.ndarray], str]:
    """Return every variable of a CTranslate2 model.bin as a numpy array (a view), aliases resolved.

    ``data`` is the file's bytes, or its parts in order (memory maps, for instance).
    """
    r = _Reader([data] if isinstance(data, (bytes, bytearray)) else data, source)
    (version,) = r.take("<I")
    if version < 5 or version > 6:
        raise ModelLoadError(f"{source}: unsupported CTranslate2 binary version {version}")
    spec = r.string()
    r.take("<I")  # spec revision
    (count,) = r.take("<I")
    variables: dict[str, np.ndarray] = {}
    stored = ""
    for _ in range(count):
        name = r.string()
        (rank,) = r.take("<B")
        shape = r.take(f"<{rank}I") if rank else ()
        (dtype_id,) = r.take("<B")
        (nbytes,) = r.take("<I")
        if r.pos + nbytes > r.size:
            raise ModelLoadError(f"{source}: model.bin is truncated inside variable {name}")
        dtype = _DTYPES.get(dtype_id)
        if dtype is None:
            raise ModelLoadError(f"{source}: unknown data type {dtype_id} for {name}")
        raw = r.slice(r.pos, nbytes)
        r.pos += nbytes
        if dtype == "bfloat16":
            as_u16 = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            array = as_u16.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=dtype)
        variables[name] = array.reshape(shape)
        if name.endswith("/weight") and array.ndim and name.startswith("encoder/layer_0"):
            stored = _DTYPE_NAMES[dtype_id]
    (n_alias,) = r.take("<I")
    for _ in range(n_alias):
        alias, target = r.string(), r.string()
        variables[alias] = variables[target]
    if spec != "WhisperSpec":
        raise ModelLoadError(f"{source}: this is a CTranslate2 '{spec}' model, not Whisper")
    return variables, stored


def _tensor(
    variables: dict[str, np.ndarray], name: str, column_major: bool = False, widen: bool = True
) -> torch.Tensor:
    """Fetch one weight as float32, dequantizing int8/int16 storage with its per-row scale (``widen``
    False: float16 storage stays float16, for a load that widens a block at a time, ``cpu/quantize.py``).

    ``column_major`` converts a matrix straight into column-major storage (a [rows, cols] view of a
    contiguous [cols, rows] buffer) without a row-major copy on the way: see ``cpu/vocab.py``.
    """
    if name not in variables:
        raise ModelLoadError(f"model.bin has no variable {name}")
    array = variables[name]
    scale = variables.get(name + "_scale")
    if scale is not None and array.dtype in (np.int8, np.int16):
        tensor = torch.from_numpy(array.astype(np.float32) / scale.astype(np.float32).reshape(-1, 1))
    else:
        dtype = np.float16 if not widen and array.dtype == np.float16 else np.float32
        if column_major and array.ndim == 2:
            out = np.empty(array.shape[::-1], dtype=dtype)
            out[...] = array.T
            tensor = torch.from_numpy(out).T
        else:
            tensor = torch.from_numpy(np.array(array, dtype=dtype))
    _release(array)
    return tensor


def _release(array: np.ndarray) -> None:
    """Hand the pages of a memory-mapped variable back to the kernel once it has been converted.

    The map is read-only and file-backed, so nothing is lost: a later read faults the pages in again.
    Arrays that do not view a map (bytes given by the caller, a converted copy) are left alone.
    """
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    if not isinstance(base, memoryview) or not isinstance(base.obj, mmap.mmap) or array.nbytes == 0:
        return
    page = mmap.PAGESIZE
    origin = np.frombuffer(base.obj, dtype=np.uint8, count=1).ctypes.data
    start = array.ctypes.data - origin
    first = start - start % page
    with contextlib.suppress(ValueError, OSError):  # a closed map, or a kernel without madvise
        base.obj.madvise(mmap.MADV_DONTNEED, first, start + array.nbytes - first)


def _scalar(variables: dict[str, np.ndarray], name: str) -> int:
    return int(variables[name].reshape(-1)[0])


def _count_layers(variables: dict[str, np.ndarray], prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/bias" in variables:
        n += 1
    return n


def _linear(sd: dict, dst: str, v: dict, src: str, widen: bool = True) -> None:
    sd[f"{dst}.weight"] = _tensor(v, f"{src}/weight", widen=widen)
    sd[f"{dst}.bias"] = _tensor(v, f"{src}/bias", widen=widen)


def _norm(sd: dict, dst: str, v: dict, src: str, widen: bool = True) -> None:
    sd[f"{dst}.weight"] = _tensor(v, f"{src}/gamma", widen=widen)
    sd[f"{dst}.bias"] = _tensor(v, f"{src}/beta", widen=widen)


def _fused_attention(sd: dict, dst: str, v: dict, src: str, names: list[str], widen: bool = True) -> None:
    """Split a fused projection (Q|K|V or K|V) into OpenAI's separate query/key/value linears."""
    weights = split_fused(_tensor(v, f"{src}/weight", widen=widen), len(names))
    biases = split_fused(_tensor(v, f"{src}/bias", widen=widen), len(names))
    for name, w, b in zip(names, weights, biases):
        sd[f"{dst}.{name}.weight"] = w
        if name == "key":
            # Whisper's key projection has no bias; CTranslate2 stores zeros there.
            if b.abs().max() > 0:
                raise ModelLoadError(f"{src}: non-zero key bias, not a Whisper attention layer")
        else:
            sd[f"{dst}.{name}.bias"] = b


def _self_attention_and_mlp(sd: dict, dst: str, v: dict, src: str, widen: bool = True) -> None:
    """The parts every block has, encoder or decoder: self-attention and the MLP, each with its norm."""
    _norm(sd, f"{dst}.attn_ln", v, f"{src}/self_attention/layer_norm", widen)
    qkv = ["query", "key", "value"]
    _fused_attention(sd, f"{dst}.attn", v, f"{src}/self_attention/linear_0", qkv, widen)
    _linear(sd, f"{dst}.attn.out", v, f"{src}/self_attention/linear_1", widen)
    _norm(sd, f"{dst}.mlp_ln", v, f"{src}/ffn/layer_norm", widen)
    _linear(sd, f"{dst}.mlp.0", v, f"{src}/ffn/linear_0", widen)
    _linear(sd, f"{dst}.mlp.2", v, f"{src}/ffn/linear_1", widen)


def ctranslate2_to_state_dict(
    v: dict[str, np.ndarray], widen: bool = True
) -> tuple[ModelDims, dict[str, torch.Tensor]]:
    """OpenAI's state dict from CTranslate2's variables, float32 (``widen`` False: float16 kept)."""
    n_enc = _count_layers(v, "encoder")
    n_dec = _count_layers(v, "decoder")
    conv1 = v["encoder/conv1/weight"]
    dims = ModelDims(
        n_mels=conv1.shape[1],
        n_audio_ctx=v["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=_scalar(v, "encoder/num_heads"),
        n_audio_layer=n_enc,
        n_vocab=v["decoder/embeddings/weight"].shape[0],
        n_text_ctx=v["decoder/position_encodings/encodings"].shape[0],
        n_text_state=v["decoder/embeddings/weight"].shape[1],
        n_text_head=_scalar(v, "decoder/num_heads"),
        n_text_layer=n_dec,
    )
    sd: dict[str, torch.Tensor] = {}
    _linear(sd, "encoder.conv1", v, "encoder/conv1", widen)
    _linear(sd, "encoder.conv2", v, "encoder/conv2", widen)
    sd["encoder.positional_embedding"] = _tensor(v, "encoder/position_encodings/encodings", widen=widen)
    for i in range(n_enc):
        _self_attention_and_mlp(sd, f"encoder.blocks.{i}", v, f"encoder/layer_{i}", widen)
    _norm(sd, "encoder.ln_post", v, "encoder/layer_norm", widen)

    # the tied vocabulary table, row-major: the default layout reads it so (``cpu/vocab.py``)
    sd["decoder.token_embedding.weight"] = _tensor(v, "decoder/embeddings/weight", widen=widen)
    sd["decoder.positional_embedding"] = _tensor(v, "decoder/position_encodings/encodings", widen=widen)
    for i in range(n_dec):
        s, d = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        _self_attention_and_mlp(sd, d, v, s, widen)
        _norm(sd, f"{d}.cross_attn_ln", v, f"{s}/attention/layer_norm", widen)
        _linear(sd, f"{d}.cross_attn.query", v, f"{s}/attention/linear_0", widen)
        _fused_attention(sd, f"{d}.cross_attn", v, f"{s}/attention/linear_1", ["key", "value"], widen)
        _linear(sd, f"{d}.cross_attn.out", v, f"{s}/attention/linear_2", widen)
    _norm(sd, "decoder.ln", v, "decoder/layer_norm", widen)
    return dims, sd


def is_ctranslate2_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "model.bin").is_file() or any(path.glob("model.bin.part*")))


@contextlib.contextmanager
def mapped_parts(paths: Sequence[Path]) -> Iterator[list[mmap.mmap]]:
    """Memory-map each file read-only for the duration of the block, then unmap them.

    A map still viewed (an error's traceback holding a variable) is left to the garbage collector
    rather than turning that error into a ``BufferError``.
    """
    maps: list[mmap.mmap] = []
    try:
        for p in paths:
            with open(p, "rb") as f:
                if p.stat().st_size == 0:
                    raise ModelLoadError(f"{p}: empty file")
                maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        yield maps
    finally:
        for m in maps:
            with contextlib.suppress(BufferError):
                m.close()


def model_bin_parts(path: Path) -> list[Path]:
    """model.bin, or its split parts (model.bin.part1, .part2 ...) in order."""
    whole = path / "model.bin"
    if whole.is_file():
        return [whole]
    return sorted(path.glob("model.bin.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))


def load_ctranslate2(path: str | Path, parts: Sequence[Path] | None = None, widen: bool = True) -> Checkpoint:
    """Load a CTranslate2 directory; ``parts`` names model.bin's pieces when they live elsewhere;
    ``widen`` False keeps float16 variables float16 (the int8 type's load, ``load.py``)."""
    path = Path(path)
    with mapped_parts(list(parts) if parts is not None else model_bin_parts(path)) as maps:
        variables, stored = read_model_bin(maps, str(path / "model.bin"))
        dims, sd = ctranslate2_to_state_dict(variables, widen)
        del variables  # the views must go before the maps close
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    ckpt = directory_checkpoint(path, dims, sd, config.get("alignment_heads"), "ctranslate2", stored)
    ckpt.extra.update(suppress_ids=config.get("suppress_ids"), lang_ids=config.get("lang_ids"))
    return ckpt
