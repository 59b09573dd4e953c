"""``load_model``: weights → the network (``model/``) → the backend that runs it (``cpu/``), decided once.

A short list of decisions, in order: the device and dtype; how the vocabulary table is stored; the
checkpoint's tensors into a ``Whisper``; then, on the CPU, the step plan (the int8 compute type
quantises first). Nothing here computes; every decision is named in the model's weights digest where
it changes numbers, so caches made one way are never taken for another's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from whisperkv.cpu.bfloat16 import convert_bfloat16
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.quantize import quantize_int8
from whisperkv.cpu.row_gemm import adopt_row_gemm
from whisperkv.cpu.vocab import DEFAULT_LAYOUT, LAYOUTS, apply_layout, choose_layout
from whisperkv.heap import give_back_free_memory, keep_freed_blocks
from whisperkv.model import KNOWN_DIMS, Whisper
from whisperkv.weights import Checkpoint, load_checkpoint

COMPUTE_TYPES = ("default", "float32", "float16", "bfloat16", "int8")


def model_from_checkpoint(
    ckpt: Checkpoint,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = torch.float32,
    vocab_layout: str | None = None,
    consume: bool = False,
) -> Whisper:
    """A model holding the checkpoint's tensors (not copies, where device and dtype allow).

    ``consume``: the checkpoint's state dict is emptied once the model holds its tensors, so that no
    tensor the model replaces (fusing query|key|value, quantising) is kept alive by the checkpoint.

    ``vocab_layout``: how the tied vocabulary table is stored (``cpu/vocab.py``); None: the default for
    a float32 CPU model, ``"measure"`` the fastest on this machine.
    """
    float32_cpu = str(device) == "cpu" and dtype == torch.float32
    if vocab_layout is None and float32_cpu:
        vocab_layout = DEFAULT_LAYOUT
    elif vocab_layout == "measure":
        vocab_layout, _ = choose_layout(ckpt.dims.n_vocab, ckpt.dims.n_text_state)
    with torch.device("meta"):  # no throwaway random init: the loaded tensors become the parameters
        model = Whisper(ckpt.dims)
    model.load_state_dict(ckpt.state_dict, strict=True, assign=True)
    if consume:
        ckpt.state_dict.clear()
    model.alignment_heads = ckpt.alignment_heads
    model.tokenizer_path = ckpt.tokenizer_path
    model.name = ckpt.extra.get("name", "")
    model.source = ckpt.source
    model.requires_grad_(False)
    model = model.to(device=device, dtype=dtype).eval()  # dtype None: each tensor as stored
    model.fuse_qkv()
    if vocab_layout is not None:
        apply_layout(model.decoder, vocab_layout)
    if float32_cpu:
        adopt_row_gemm(model.decoder)  # decoder steps as GEMMs of 2-3 rows (cpu/row_gemm.py)
    return model


def load_model(
    name_or_path: str = "tiny.en",
    device: str | torch.device | None = "cpu",
    dtype: torch.dtype | str | None = None,
    download_root: str | None = None,
    compute_type: str = "default",
    vocab_layout: str = DEFAULT_LAYOUT,
    in_memory: bool = False,
) -> Whisper:
    """Load a model by name ("tiny.en", "base") or path, like ``whisper.load_model``.

    ``vocab_layout`` (float32 on the CPU): how the tied vocabulary table is stored (``cpu/vocab.py``).
    The default is fixed, not measured, so that every process loading the model computes the same bits:
    a layout picked by a timing race would let two workers of one job give transcripts whose scores
    differ in their last digits. ``"measure"`` times the layouts on this machine and keeps the fastest.

    ``dtype`` defaults to float32 on CPU and float16 on CUDA. ``compute_type="int8"`` quantises the
    linear layers (CPU only; an approximation whose agreement is measured, see ``cpu/quantize.py``);
    ``"bfloat16"`` on the CPU is the bfloat16 compute type (``cpu/bfloat16.py``: converted a block at a
    time from the stored weights; another approximation), elsewhere the dtype, as "float32"/"float16" set it.
    ``download_root`` and ``in_memory`` are accepted for compatibility and ignored: whisperkv never
    downloads, and always reads the weights into memory.
    ``device=None`` picks CUDA where there is one, as openai-whisper's ``load_model`` does.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = _dtype(compute_type, dtype, device)
    if vocab_layout not in (*LAYOUTS, "measure"):
        raise ValueError(f"unknown vocab_layout {vocab_layout!r}: {', '.join(LAYOUTS)} or measure")
    cpu = str(device) == "cpu"
    convert = None  # the int8 type (CPU only: refused elsewhere by name), the bfloat16 type on the CPU
    if compute_type == "int8" or (cpu and compute_type == "bfloat16"):
        convert = quantize_int8 if compute_type == "int8" else convert_bfloat16
    if convert is not None:  # made from the stored weights a block at a time, with its own step plan
        model = _converted_model(name_or_path, device, convert)
    else:
        layout = None
        if cpu and dtype == torch.float32:
            layout = vocab_layout
            if vocab_layout == "measure":  # before the weights: one peak, not two
                layout, _ = choose_layout(*_vocab_shape(name_or_path))
        ckpt = load_checkpoint(name_or_path)  # consumed: no tensor the model replaces is kept by it
        model = model_from_checkpoint(ckpt, device=device, dtype=dtype, vocab_layout=layout, consume=True)
        if cpu and dtype == torch.float32:
            use_attention_kernels(model)  # the CPU backend's plan, its kernels where a compiler builds them
    if cpu:
        # a window's freed activations stay for the next (``heap.py``); set after loading, so that
        # the loader's transient copies go back to the system (set before: +38 MB peak RSS, int8), and
        # what the load freed in the heap's middle goes back now (the float16 tensors widened one by one,
        # the float32 ones the int8 type replaced: small's int8 held 894 MB after loading, 755 trimmed)
        give_back_free_memory()
        keep_freed_blocks()
    return model


def _converted_model(
    name_or_path: str, device: str | torch.device, convert: Callable[..., Whisper]
) -> Whisper:
    """The int8 or bfloat16 type (``convert``: ``quantize_int8`` or ``convert_bfloat16``), loaded without
    the whole float32 model: a float16 checkpoint's tensors stay float16 until ``convert`` widens and
    converts them a block at a time, so the load's peak holds the float16 weights and one block in
    float32 (large-v3-turbo int8: 4,440 MB before); a zip-format ``.pt`` is memory-mapped and its pages
    handed back as they are converted, so not even the float16 weights are held whole. The same weights,
    digest and tokens as converting the loaded float32 model (``tests/test_int8_load.py``)."""
    ckpt = load_checkpoint(name_or_path, widen=False)
    pages = ckpt.extra.get("mapped")  # a memory-mapped .pt (``weights/mapped.py``)
    # consumed: each stored tensor is freed as its block is converted
    model = model_from_checkpoint(ckpt, device=device, dtype=None, consume=True)
    if pages is not None:
        pages.drop()  # what fusing query|key|value read (it copied them)
    return convert(model, release=None if pages is None else pages.drop)


def _dtype(compute_type: str, dtype: torch.dtype | str | None, device: str | torch.device) -> torch.dtype:
    """The weights' dtype: the compute type's where it names one, else ``dtype``, else the device's."""
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(
            f"unknown compute_type {compute_type!r}: default, float32, float16, bfloat16 or int8"
        )
    if compute_type in ("float32", "float16", "bfloat16"):
        dtype = compute_type
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None:
        dtype = torch.float16 if str(device).startswith("cuda") else torch.float32
    return dtype


def _vocab_shape(name_or_path: str) -> tuple[int, int]:
    """(n_vocab, n_text_state) of a known model name; tiny.en's for a path (timing is per byte anyway)."""
    dims = KNOWN_DIMS.get(str(name_or_path), KNOWN_DIMS["tiny.en"])
    return dims.n_vocab, dims.n_text_state
