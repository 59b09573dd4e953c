"""``whisperkv.detect_language(model, mel)``: openai-whisper's module-level language identification.

Its result has the reference's shape, language *token ids* and one probability dict per window, so code
written against ``whisper.detect_language`` runs unchanged. ``model.detect_language(audio)`` is
whisperkv's own shape (a language code and one dict, from a path, waveform or Mel) and stays so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer


@torch.no_grad()
def detect_language(
    model: Whisper, mel: torch.Tensor, tokenizer: Tokenizer | None = None
) -> tuple[torch.Tensor, dict[str, float] | list[dict[str, float]]]:
    """(language token ids, probabilities by code) for Mel windows [B, n_mels, 3000] or encoder output.

    One step after <|startoftranscript|>, every non-language logit masked; an unbatched input
    ([n_mels, 3000]) gives a 0-d tensor and one dict. An English-only model (or a tokenizer with no
    language token in its prompt) raises ``ValueError``, as the reference does.
    """
    if tokenizer is None:
        tokenizer = model.tokenizer
        if model.is_multilingual:
            tokenizer = tokenizer.with_options(language=tokenizer.language or "en")
    if (
        not tokenizer.multilingual
        or tokenizer.language is None
        or tokenizer.language_token(tokenizer.language) not in tokenizer.sot_sequence
    ):
        raise ValueError("This model doesn't have language tokens so it can't perform lang id")

    single = mel.ndim == 2
    if single:
        mel = mel.unsqueeze(0)
    if mel.shape[-2:] != (model.dims.n_audio_ctx, model.dims.n_audio_state):
        mel = model.embed_audio(mel)

    sot = torch.full((mel.shape[0], 1), tokenizer.sot, dtype=torch.long, device=model.device)
    logits = model.logits(sot, mel)[:, 0].float()
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[list(tokenizer.all_language_tokens)] = True
    logits[:, ~keep] = float("-inf")
    language_tokens = logits.argmax(dim=-1)
    probs = logits.softmax(dim=-1).cpu()
    pairs = list(zip(tokenizer.all_language_tokens, tokenizer.all_language_codes))
    language_probs = [{code: probs[i, token].item() for token, code in pairs} for i in range(len(probs))]
    if single:
        return language_tokens[0], language_probs[0]
    return language_tokens, language_probs
