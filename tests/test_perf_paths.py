"""Each fast path of performance round 2 against its slow twin: same tokens, or a bounded difference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import clip_path, english_clips, torch_threads
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.vocab import LAYOUTS, apply_layout, choose_layout, column_major, current_layout
from whisperkv.weights.ctranslate2 import load_ctranslate2, model_bin_parts, read_model_bin


def _layout_runs(model, clips: list, layouts=LAYOUTS) -> tuple[dict[str, list], float]:
    """Greedy tokens of each clip's first window under every layout, and the largest logit difference
    of any layout from the reference (``rows``) at any step of those decodes."""
    from whisperkv.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
    from whisperkv.decoding.decode import decode_window
    from whisperkv.decoding.options import DecodingOptions

    decoder = model.decoder
    before = current_layout(decoder)
    options = DecodingOptions(language="en", without_timestamps=False, record_logits=True)
    tokenizer = model.tokenizer.with_options(language="en")
    features = [
        model.embed_audio(
            pad_or_trim(log_mel_spectrogram(load_audio(str(p)), model.dims.n_mels), N_FRAMES)[None]
        )
        for p in clips
    ]
    tokens: dict[str, list] = {}
    logits: dict[str, list] = {}
    try:
        for layout in layouts:
            apply_layout(decoder, layout)
            runs = [decode_window(model, tokenizer, f, options) for f in features]
            tokens[layout] = [r.tokens for r in runs]
            logits[layout] = [r.step_logits for r in runs]
    finally:
        apply_layout(decoder, before)
        use_attention_kernels(model)  # the table float16 again, where the step rows kernel reads it
    worst = 0.0
    for layout in layouts:
        for mine, ref in zip(logits[layout], logits["rows"]):
            for a, b in zip(mine, ref):  # steps both took (the same ones while the tokens agree)
                worst = max(worst, float((a - b).abs().max()))
    return tokens, worst


def test_every_vocabulary_layout_gives_the_reference_logits_and_tokens(tiny_model, speech_dir):
    """The reference computes x @ E.T on the row-major table; the other layouts only reorder sums."""
    decoder = tiny_model.decoder
    before = current_layout(decoder)
    x = torch.randn(3, 1, 384, generator=torch.Generator().manual_seed(1))
    table = decoder.token_embedding.weight.detach().float().contiguous()  # float16-held: exact values
    reference = x @ table.T
    try:
        for layout in LAYOUTS:
            apply_layout(decoder, layout)
            assert current_layout(decoder) == layout
            assert torch.equal(decoder.token_embedding.weight, table)  # the same values, one copy
            for rows in (x[:1], x):  # one row (the numpy path) and several (PyTorch)
                assert (_project(decoder, rows) - reference[: rows.shape[0]]).abs().max() < 1e-4, layout
    finally:
        apply_layout(decoder, before)
        use_attention_kernels(tiny_model)  # the table float16 again, where the step rows kernel reads it
    clips = sorted(english_clips(), key=lambda r: float(r["duration_s"]))[2:4]  # two short real clips
    tokens, worst = _layout_runs(tiny_model, [clip_path(r) for r in clips])
    assert all(tokens[layout] == tokens["rows"] for layout in LAYOUTS)
    assert all(len(t) > 1 for t in tokens["rows"])  # real transcripts, not an empty decode
    assert worst < 1e-3


@pytest.mark.slow
def test_vocabulary_layouts_agree_on_every_english_clip(tiny_model, speech_dir, capsys):
    tokens, worst = _layout_runs(tiny_model, [clip_path(r) for r in english_clips()])
    with capsys.disabled():
        print(f"\nvocabulary layouts over {len(tokens['rows'])} clips: max |dlogit| {worst:.2e}")
    assert all(tokens[layout] == tokens["rows"] for layout in LAYOUTS)


def _project(decoder, x: torch.Tensor) -> torch.Tensor:
    """The decoder's vocabulary projection of already-normalised rows (its ``_logits`` minus the norm)."""
    if decoder.logits_projection is not None:
        return decoder.logits_projection(x).float()
    return (x @ decoder.token_embedding.weight.T).float()


def test_layout_choice_measures_every_layout():
    best, timings = choose_layout(4096, 64, repeats=3)
    assert set(timings) == set(LAYOUTS) and best in LAYOUTS
    assert timings[best] == min(timings.values()) and all(t > 0 for t in timings.values())
    with pytest.raises(ValueError, match="unknown vocabulary layout"):
        apply_layout(torch.nn.Module(), "diagonal")


def test_column_major_keeps_values_and_shape():
    w = torch.randn(7, 5)
    c = column_major(w)
    assert torch.equal(c, w) and c.shape == (7, 5) and c.T.is_contiguous()
    assert column_major(c) is c


def test_memory_mapped_loading_equals_reading_the_bytes():
    """The mapped, page-releasing loader gives exactly the tensors the whole-file read gives."""
    import whisperkv.weights.registry as registry
    from whisperkv.weights.ctranslate2 import ctranslate2_to_state_dict

    path = registry._tiny_en_dir()
    mapped = load_ctranslate2(path).state_dict
    data = b"".join(p.read_bytes() for p in model_bin_parts(path))
    _, from_bytes = ctranslate2_to_state_dict(read_model_bin(data)[0])
    assert mapped.keys() == from_bytes.keys()
    for name, tensor in from_bytes.items():
        assert torch.equal(mapped[name], tensor), name
    assert mapped["decoder.token_embedding.weight"].is_contiguous()  # row-major: the default layout's


def test_model_split_into_parts_reads_across_the_cut(tmp_path):
    """A variable cut in two by the part boundary (the base model ships in halves) is read whole."""
    import whisperkv.weights.registry as registry

    src = registry._tiny_en_dir()
    data = (src / "model.bin").read_bytes()
    cut = len(data) // 2 + 12345  # inside some variable's bytes
    (tmp_path / "model.bin.part1").write_bytes(data[:cut])
    (tmp_path / "model.bin.part2").write_bytes(data[cut:])
    (tmp_path / "config.json").write_bytes((src / "config.json").read_bytes())
    split = load_ctranslate2(tmp_path).state_dict
    whole = load_ctranslate2(src).state_dict
    for name in ("decoder.token_embedding.weight", "encoder.blocks.2.mlp.0.weight", "decoder.ln.bias"):
        assert torch.equal(split[name], whole[name]), name


def test_numpy_projection_falls_back_for_other_dtypes():
    from whisperkv.cpu.vocab import NumpyRowProjection

    w = torch.randn(50, 8)
    proj = NumpyRowProjection(w)
    x = torch.randn(1, 1, 8)
    np.testing.assert_allclose(proj(x).numpy(), (x @ w.T).numpy(), atol=1e-5)
    assert proj(x.double()).dtype == torch.float64


def test_window_segments_cut_at_timestamp_pairs_and_resume_after_the_last(tiny_model):
    """Segments at the window's timestamp pairs, at real times (window start + stamp), and where what was
    decoded ends: the last stamp, or the window's end when the tokens have no pair."""
    from whisperkv.batched import Chunk, window_segments
    from whisperkv.decoding.options import DecodingResult

    tokenizer = tiny_model.tokenizer
    ts = tokenizer.timestamp_begin
    window = Chunk(100 * 16000, 105 * 16000)

    def cut(tokens, timestamps=True):
        result = DecodingResult(audio_features=None, language="en", tokens=tokens)
        segments, next_seek = window_segments(tokenizer, result, window, timestamps)
        return [(s["start"], s["end"], s["tokens"]) for s in segments], next_seek / 16000

    # <0.00> a b <1.00><1.00> c <2.40><2.40>: ends on a pair, so what follows 102.4 s is decoded again
    pairs = [ts, 10, 11, ts + 50, ts + 50, 12, ts + 120, ts + 120]
    assert cut(pairs) == ([(100.0, 101.0, pairs[:4]), (101.0, 102.4, pairs[4:7])], 102.4)
    # a lone last stamp ("no more speech"): decoded to 102.4 s as well; the detector judges the rest
    assert cut(pairs[:-1]) == ([(100.0, 101.0, pairs[:4]), (101.0, 102.4, pairs[4:7])], 102.4)
    # a stamp past the window's audio (into its padding) is clipped to the window's end
    assert cut([ts, 10, ts + 1400]) == ([(100.0, 105.0, [ts, 10, ts + 1400])], 105.0)
    # without timestamps: the window is one segment
    assert cut([10, 11], timestamps=False) == ([(100.0, 105.0, [10, 11])], 105.0)


@pytest.fixture(scope="module")
def two_utterances(speech_dir):
    from whisperkv.audio import load_audio

    rows = sorted(english_clips(), key=lambda r: float(r["duration_s"]))[-2:]  # the two longest short ones
    pause = np.zeros(32000, dtype=np.float32)
    return np.concatenate(
        [pause, load_audio(clip_path(rows[0])), pause, load_audio(clip_path(rows[1])), pause]
    )


@pytest.mark.slow  # four batched decodes (45 s on the loaded VM)
def test_batched_segments_carry_timestamps_inside_their_chunks(tiny_model, two_utterances):
    from whisperkv.batched import transcribe_batched

    stamped = transcribe_batched(tiny_model, two_utterances)
    plain = transcribe_batched(tiny_model, two_utterances, timestamps=False)
    assert len(stamped["segments"]) > len(plain["segments"])  # sentence-sized cues, not one per chunk
    bounds = [(s["start"], s["end"]) for s in plain["segments"]]
    for seg in stamped["segments"]:
        assert seg["start"] <= seg["end"]
        assert any(lo - 0.01 <= seg["start"] and seg["end"] <= hi + 0.01 for lo, hi in bounds), seg
    starts = [s["start"] for s in stamped["segments"]]
    assert starts == sorted(starts)
    from whisperkv.metrics import word_errors

    errors, words = word_errors(plain["text"], stamped["text"])
    assert errors <= max(2, words // 10)  # the same speech, decoded with or without timestamps


def test_silero_chunks_cover_the_speech_within_30_s(two_utterances):
    from whisperkv.batched import split_with_silero

    with torch_threads(2):
        chunks = split_with_silero(two_utterances)
        assert torch.get_num_threads() == 2  # silero's import does not leave the process on 1 thread
    assert chunks and all(0 < c.end - c.start <= 30 * 16000 for c in chunks)
    assert chunks[0].start >= 16000  # the leading 2 s pause is not speech
    assert all(a.end <= b.start for a, b in zip(chunks, chunks[1:]))
    with pytest.raises(ValueError, match="unknown vad"):
        from whisperkv.batched import transcribe_batched

        transcribe_batched(None, two_utterances, vad="webrtc")


def test_default_vocabulary_layout_is_fixed_not_measured(tiny_model):
    """Every process gets the same layout (so the same bits): a timing race must not choose it."""
    import whisperkv

    assert current_layout(tiny_model.decoder) == "rows-gemm"
    with pytest.raises(ValueError, match="vocab_layout"):
        whisperkv.load_model("tiny.en", vocab_layout="diagonal")


def test_chunk_widths_cover_every_row_count_with_twos_and_threes():
    from whisperkv.cpu.row_gemm import chunk_widths, group_widths

    assert chunk_widths(1) == [2] and chunk_widths(4) == [2, 2] and chunk_widths(7) == [3, 2, 2]
    for n in range(1, 40):
        widths = chunk_widths(n)
        assert set(widths) <= {2, 3} and n <= sum(widths) <= max(n, 2)
        assert chunk_widths(n, (2,)) == [2] * ((n + 1) // 2)
    assert group_widths(5) == [5] and group_widths(11) == [6, 5] and group_widths(16) == [8, 8]
    for n in range(4, 60):
        assert sum(group_widths(n)) == n and all(4 <= w <= 10 for w in group_widths(n))


def test_row_plan_packs_small_groups_and_keeps_large_groups_alone():
    from whisperkv.cpu.row_gemm import RowWidths, plan_rows

    widths = RowWidths(torch.randn(8, 4))
    widths.small, widths.large = (3, 2), True  # the plan itself, whatever this CPU's BLAS measured
    assert plan_rows([1], widths) == ((0, 1, 2),)  # one row, padded to a GEMM of two
    assert plan_rows([1, 1, 1], widths) == ((0, 3, 3),)
    assert plan_rows([1, 5, 2], widths) == ((0, 1, 2), (1, 6, 5), (6, 8, 2))
    assert plan_rows([12], widths) == ((0, 6, 6), (6, 12, 6))
    widths.large = False  # where 4..10 columns disagree on this CPU, beams are packed like the rest
    assert plan_rows([5], widths) == ((0, 3, 3), (3, 5, 2))


@pytest.mark.parametrize("weight_first", [False, True], ids=["X@W.T", "W@X.T"])
def test_row_gemm_gives_a_row_the_same_bits_in_any_batch(tiny_model, weight_first):
    """Each decoder matrix, in either orientation a CPU's chunks take (Intel's, AMD's): a row's product
    alone equals the same row among 1..8 other windows' rows, a beam group's rows equal their group
    alone whatever is around it, and both are within float rounding of the reference ``x @ W.T``."""
    from whisperkv.cpu.row_gemm import RowWidths, rows_times

    decoder = tiny_model.decoder
    block = decoder.blocks[1]
    x = torch.randn(14, 1536, generator=torch.Generator().manual_seed(3))
    for weight, linear in (
        (block.attn.qkv.weight.float(), block.attn.qkv),  # held float16 for the kernel: the GEMMs
        (block.mlp[0].weight.float(), block.mlp[0]),  # read float32
        (block.mlp[2].weight.float(), block.mlp[2]),
        (decoder.token_embedding.weight.float(), decoder.logits_projection),
    ):
        rows = x[:, : weight.shape[1]].contiguous()
        widths = RowWidths(weight, weight_first)
        solo = [rows_times(weight, rows[i : i + 1], widths)[0] for i in range(9)]
        for n in range(1, 10):
            out = rows_times(weight, rows[:n], widths, [1] * n)
            assert out.is_contiguous()
            for i in range(n):
                assert torch.equal(out[i], solo[i]), (tuple(weight.shape), n, i)
        bias = torch.linspace(-1, 1, weight.shape[0])  # added inside the GEMM: a row's bits its own too
        with_bias = [rows_times(weight, rows[i : i + 1], widths, None, bias)[0] for i in range(9)]
        out = rows_times(weight, rows[:9], widths, [1] * 9, bias)
        assert all(torch.equal(out[i], with_bias[i]) for i in range(9)), tuple(weight.shape)
        assert (torch.stack(with_bias) - torch.stack(solo) - bias).abs().max() < 1e-4
        beams = rows_times(weight, rows[9:14], widths)  # one window of 5 beams, alone
        for sizes in ([1, 5], [2, 1, 5, 3], [5, 1]):
            mixed = torch.cat([rows[:9][: sum(sizes) - 5], rows[9:14]]) if sizes[-1] != 1 else None
            if sizes == [5, 1]:
                out = rows_times(weight, torch.cat([rows[9:14], rows[:1]]), widths, sizes)
                assert torch.equal(out[:5], beams) and torch.equal(out[5], solo[0])
                continue
            before = sum(sizes[: sizes.index(5)])
            mixed = torch.cat([rows[:before], rows[9:14], rows[before : sum(sizes) - 5]])
            out = rows_times(weight, mixed, widths, sizes)
            assert torch.equal(out[before : before + 5], beams), (tuple(weight.shape), sizes)
            for i in [*range(before), *range(before + 5, sum(sizes))]:
                j = i if i < before else i - 5
                assert torch.equal(out[i], solo[j]), (tuple(weight.shape), sizes, i)
        assert (torch.stack(solo) - rows[:9] @ weight.T).abs().max() < 1e-4
        # the module itself takes one-position rows this way, and longer inputs as F.linear does
        bias = getattr(linear, "bias", None)
        expected = rows_times(weight, rows[:4], linear.widths, None, bias)
        if getattr(linear, "kernel", None) is not None:  # the projection reads through the steps' kernel
            expected = linear.kernel(rows[:4], linear.weight, None)
        assert torch.equal(linear(rows[:4, None])[:, 0], expected)
        if linear is not decoder.logits_projection:  # the projection reads every row its own way
            prompt = rows[None, :4]  # several positions of one row: F.linear as before
            assert torch.equal(linear(prompt), torch.nn.functional.linear(prompt, weight, bias))


def test_a_decoder_step_of_many_caches_equals_each_alone(tiny_model):
    """forward_rows over three windows' caches gives each window's logits bit for bit as its solo step."""
    dec = tiny_model.decoder
    g = torch.Generator().manual_seed(5)
    features = [torch.randn(1, 1500, 384, generator=g) for _ in range(3)]
    crosses = [dec.project_cross_kv(f, tiny_model.encoder_provenance(f)) for f in features]

    def fresh():
        caches = [dec.new_cache(c, batch_size=rows) for c, rows in zip(crosses, (1, 2, 1))]
        for cache, rows in zip(caches, (1, 2, 1)):
            dec(torch.tensor([[50257, 50362]] * rows), cache)
        return caches

    with torch.no_grad():
        caches = fresh()
        tokens = [torch.tensor([[440]]), torch.tensor([[440], [262]]), torch.tensor([[11]])]
        together = dec.forward_rows(list(zip(tokens, caches)))
        start = 0
        for i, t in enumerate(tokens):
            alone = dec.forward_rows([(t, fresh()[i])])
            assert torch.equal(together[start : start + t.shape[0]], alone), i
            start += t.shape[0]
