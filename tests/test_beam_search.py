"""Beam search's bookkeeping against the reference's own way of doing it: candidates keyed by their
whole token sequences (openai-whisper's ``BeamSearchDecoder.update``), here written out as the slow twin.
``BeamSearch`` keys them by (prefix id, token) instead; the kept rows, their sources and scores, the
finished candidates and their order must be the same, duplicates (identical beams) included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from whisperkv.decoding.search import BeamSearch

EOT = 7


def reference_update(beam_size, finished, max_candidates, tokens, logits, sum_logprobs):
    """openai-whisper's update: sequences as tuple keys (the twin; returns what ``BeamSearch`` does)."""
    n_audio = tokens.shape[0] // beam_size
    logprobs = F.log_softmax(logits.float(), dim=-1)
    top_logprobs, top_ids = logprobs.topk(beam_size + 1, dim=-1)
    candidate_scores = (sum_logprobs.float()[:, None] + top_logprobs).numpy()
    prefixes, top_ids = tokens.tolist(), top_ids.tolist()
    rows, sources = [], []
    for a in range(n_audio):
        scores, parent = {}, {}
        for b in range(beam_size):
            row = a * beam_size + b
            for score, tok in zip(candidate_scores[row].tolist(), top_ids[row]):
                seq = tuple(prefixes[row] + [tok])
                scores[seq] = score
                parent[seq] = row
        kept, newly_finished = 0, {}
        for seq in sorted(scores, key=scores.get, reverse=True):
            if seq[-1] == EOT:
                newly_finished[seq] = scores[seq]
                continue
            sum_logprobs[len(rows)] = scores[seq]
            rows.append(list(seq))
            sources.append(parent[seq])
            kept += 1
            if kept == beam_size:
                break
        for seq in sorted(newly_finished, key=newly_finished.get, reverse=True):
            if len(finished[a]) >= max_candidates:
                break
            finished[a][seq] = newly_finished[seq]
    return torch.tensor(rows), torch.tensor(sources)


@pytest.mark.parametrize("n_audio", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_beam_update_matches_the_reference_bookkeeping(n_audio, seed):
    beam, vocab = 5, 12  # a small vocabulary: end of text and ties among candidates come up often
    g = torch.Generator().manual_seed(seed)
    search = BeamSearch(beam, EOT, patience=None)
    tokens = torch.full((n_audio * beam, 3), 1, dtype=torch.long)  # every beam of a window the same
    sums = torch.zeros(n_audio * beam)
    twin_tokens, twin_sums, twin_finished = tokens.clone(), sums.clone(), [{} for _ in range(n_audio)]
    for step in range(8):
        logits = torch.randn(n_audio * beam, vocab, generator=g) * 2
        logits[:, 2] = logits[:, 3]  # a tie between two tokens in every row
        tokens, completed, sources = search.update(tokens, logits, sums)
        twin_tokens, twin_sources = reference_update(
            beam, twin_finished, search.max_candidates, twin_tokens, logits, twin_sums
        )
        assert torch.equal(tokens, twin_tokens), step
        assert torch.equal(sources, twin_sources), step
        assert torch.equal(sums, twin_sums), step
        assert [list(d.items()) for d in search.finished] == [list(d.items()) for d in twin_finished], step
    assert any(search.finished)  # end of text came up, so the finished candidates were compared
