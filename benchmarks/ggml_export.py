"""Write an OpenAI Whisper ``.pt`` as a whisper.cpp ggml file (float16), for the benchmark's whisper.cpp peer.

Our own writer of the layout whisper.cpp reads (the one its ``models/convert-pt-to-ggml.py`` writes), so
whisper.cpp runs on exactly the weights the other engines use, without a download:

* int32 magic ``0x67676d6c`` ("ggml"), then int32 n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype (1 = float16);
* the Mel filterbank: int32 rows, int32 columns, then rows × columns float32;
* the vocabulary: int32 count, then per token (in id order, special tokens excluded) int32 length + bytes;
* every tensor: int32 n_dims, int32 name length, int32 ftype (0 float32, 1 float16), the dimensions
  innermost first, the name, the raw data. Matrices are float16; vectors, convolution biases (stored
  [n, 1]) and both positional embeddings stay float32.

The file goes to a temporary or cache directory at run time; it is never committed.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

GGML_MAGIC = 0x67676D6C
FLOAT32_NAMES = {
    "encoder.conv1.bias",
    "encoder.conv2.bias",
    "encoder.positional_embedding",
    "decoder.positional_embedding",
}


def write_ggml(pt_path: str | Path, out_path: str | Path) -> Path:
    """Convert ``pt_path`` (``{"dims", "model_state_dict"}``) to a float16 ggml file at ``out_path``."""
    from whisperkv.audio import mel_filters
    from whisperkv.model.dims import ModelDims
    from whisperkv.tokenizer import Tokenizer
    from whisperkv.weights.registry import default_tokenizer_path

    checkpoint = torch.load(pt_path, map_location="cpu", weights_only=True)
    dims = checkpoint["dims"]
    model_dims = ModelDims(**dims)
    tokenizer = Tokenizer.from_file(
        default_tokenizer_path(model_dims),
        multilingual=model_dims.is_multilingual,
        num_languages=model_dims.num_languages,
    )
    filters = mel_filters(dims["n_mels"]).to(torch.float32).numpy()
    out_path = Path(out_path)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<i", GGML_MAGIC))
        for key in (
            "n_vocab",
            "n_audio_ctx",
            "n_audio_state",
            "n_audio_head",
            "n_audio_layer",
            "n_text_ctx",
            "n_text_state",
            "n_text_head",
            "n_text_layer",
            "n_mels",
        ):
            f.write(struct.pack("<i", dims[key]))
        f.write(struct.pack("<i", 1))  # float16 matrices
        f.write(struct.pack("<ii", *filters.shape))
        f.write(np.ascontiguousarray(filters, dtype="<f4").tobytes())
        f.write(struct.pack("<i", tokenizer.eot))  # ordinary tokens: ids 0 .. eot-1
        for token_id in range(tokenizer.eot):
            raw = tokenizer.token_bytes(token_id)
            f.write(struct.pack("<i", len(raw)) + raw)
        for name, tensor in checkpoint["model_state_dict"].items():
            data = tensor.detach().float().squeeze().numpy()
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(data.shape[0], 1)
            half = data.ndim >= 2 and name not in FLOAT32_NAMES
            data = np.ascontiguousarray(data, dtype="<f2" if half else "<f4")
            encoded = name.encode()
            f.write(struct.pack("<iii", data.ndim, len(encoded), 1 if half else 0))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(encoded)
            f.write(data.tobytes())
    return out_path
