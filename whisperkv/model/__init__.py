"""The network: dimensions, attention, encoder, decoder, and the Whisper module that joins them."""

from __future__ import annotations

import torch

from whisperkv.heap import keep_freed_blocks
from whisperkv.model.attend_kernel import use_attention_kernels
from whisperkv.model.dims import KNOWN_DIMS, ModelDims
from whisperkv.model.row_gemm import adopt_row_gemm
from whisperkv.model.vocab import DEFAULT_LAYOUT, LAYOUTS, apply_layout, choose_layout
from whisperkv.model.whisper import Whisper
from whisperkv.weights import Checkpoint, load_checkpoint

__all__ = ["KNOWN_DIMS", "ModelDims", "Whisper", "load_model", "model_from_checkpoint"]

SPECULATIVE_NEEDS = (
    "speculative decoding needs a float32 CPU model with the rows-gemm vocabulary layout, "
    "without vocab_screen and not of the int8 compute type"
)


def model_from_checkpoint(
    ckpt: Checkpoint,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    vocab_layout: str | None = None,
    vocab_screen: bool = False,
) -> Whisper:
    """A model holding the checkpoint's tensors (not copies, where device and dtype allow).

    ``vocab_layout``: how the tied vocabulary table is stored (``model/vocab.py``); None measures the
    fastest on this machine for a float32 CPU model (``load_model`` measures before reading weights).
    """
    if vocab_layout is None and str(device) == "cpu" and dtype == torch.float32:
        vocab_layout = DEFAULT_LAYOUT
    elif vocab_layout == "measure":
        vocab_layout, _ = choose_layout(ckpt.dims.n_vocab, ckpt.dims.n_text_state)
    with torch.device("meta"):  # no throwaway random init: the loaded tensors become the parameters
        model = Whisper(ckpt.dims)
    model.load_state_dict(ckpt.state_dict, strict=True, assign=True)
    model.alignment_heads = ckpt.alignment_heads
    model.tokenizer_path = ckpt.tokenizer_path
    model.name = ckpt.extra.get("name", "")
    model.source = ckpt.source
    model.requires_grad_(False)
    model = model.to(device=device, dtype=dtype).eval()
    model.fuse_qkv()
    if vocab_layout is not None:
        apply_layout(model.decoder, vocab_layout, screen=vocab_screen)
    if str(device) == "cpu" and dtype == torch.float32:
        adopt_row_gemm(model.decoder)  # decoder steps as 2-3 column GEMMs (model/row_gemm.py)
    return model


def load_model(
    name_or_path: str = "tiny.en",
    device: str | torch.device | None = "cpu",
    dtype: torch.dtype | str | None = None,
    download_root: str | None = None,
    compute_type: str = "default",
    vocab_layout: str = DEFAULT_LAYOUT,
    vocab_screen: bool = False,
    speculative: bool = False,
    in_memory: bool = False,
) -> Whisper:
    """Load a model by name ("tiny.en", "base") or path, like ``whisper.load_model``.

    ``vocab_layout`` (float32 on the CPU): how the tied vocabulary table is stored (``model/vocab.py``).
    The default is fixed, not measured, so that every process loading the model computes the same bits:
    a layout picked by a timing race would let two workers of one job give transcripts whose scores
    differ in their last digits. ``"measure"`` times the layouts on this machine and keeps the fastest.

    ``vocab_screen`` (float32 CPU, ``rows-gemm``): greedy steps read an int8 copy of the vocabulary table
    and compute exactly only the tokens its bound cannot rule out (``model/vocab_screen.py``): the same
    tokens, in 0.88-0.99 of the time on tiny.en but 1.09-1.10 on base's longer files, for 27-97 MB
    more peak memory (round 11: the float16 table, ``model/step_rows.py``, made the full product cheap
    enough that the screen no longer pays everywhere). Off by default.

    ``speculative`` (float32 CPU, ``rows-gemm``): keep an int8 draft of the decoder (``model/draft.py``)
    whose guesses greedy steps at temperature 0 check two rows at a time (``decoding/speculative.py``):
    the same tokens and scores in fewer float32 steps. Not with ``vocab_screen`` (each replaces the
    same greedy step). Off by default.

    ``dtype`` defaults to float32 on CPU and float16 on CUDA. ``compute_type="int8"`` quantises the
    linear layers (CPU only; an approximation whose agreement is measured, see ``model/quantize.py``);
    "float32"/"float16"/"bfloat16" set the dtype. ``download_root`` and ``in_memory`` are accepted for
    compatibility and ignored: whisperkv never downloads, and always reads the weights into memory.
    ``device=None`` picks CUDA where there is one, as openai-whisper's ``load_model`` does.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if compute_type in ("float32", "float16", "bfloat16"):
        dtype = compute_type
    elif compute_type not in ("default", "int8"):
        raise ValueError(
            f"unknown compute_type {compute_type!r}: default, float32, float16, bfloat16 or int8"
        )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None:
        dtype = torch.float16 if str(device).startswith("cuda") else torch.float32
    if vocab_layout not in (*LAYOUTS, "measure"):
        raise ValueError(f"unknown vocab_layout {vocab_layout!r}: {', '.join(LAYOUTS)} or measure")
    if speculative and (
        compute_type == "int8"
        or vocab_screen
        or vocab_layout not in ("rows-gemm", "measure")
        or str(device) != "cpu"
        or dtype != torch.float32
    ):
        raise ValueError(SPECULATIVE_NEEDS)  # before reading any weights
    layout = None
    if str(device) == "cpu" and dtype == torch.float32:
        layout = vocab_layout
        if vocab_layout == "measure":  # before the weights: one peak, not two
            layout, _ = choose_layout(*_vocab_shape(name_or_path))
    model = model_from_checkpoint(
        load_checkpoint(name_or_path),
        device=device,
        dtype=dtype,
        vocab_layout=layout,
        vocab_screen=vocab_screen,
    )
    if speculative:
        from whisperkv.model.draft import DraftDecoder, can_draft

        if not can_draft(model.decoder):  # "measure" chose another layout
            raise ValueError(SPECULATIVE_NEEDS)
        model.decoder.draft = DraftDecoder(model.decoder)
    if compute_type == "int8":
        from whisperkv.model.quantize import quantize_int8

        quantize_int8(model)
    elif str(device) == "cpu" and dtype == torch.float32:
        use_attention_kernels(model)  # decoder steps through the C kernel where a compiler builds it
    if str(device) == "cpu":
        # a window's freed activations stay for the next (``heap.py``); set after loading, so that
        # the loader's transient copies go back to the system (set before: +38 MB peak RSS, int8)
        keep_freed_blocks()
    return model


def _vocab_shape(name_or_path: str) -> tuple[int, int]:
    """(n_vocab, n_text_state) of a known model name; tiny.en's for a path (timing is per byte anyway)."""
    dims = KNOWN_DIMS.get(str(name_or_path), KNOWN_DIMS["tiny.en"])
    return dims.n_vocab, dims.n_text_state
