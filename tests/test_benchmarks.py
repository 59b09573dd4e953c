"""The benchmark scripts' code paths run (on CPU, tiny shapes): a GPU session can trust them to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from whisperkv.batched import speech_frames, split_at_silences

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_its_path_on_cpu():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "smoke (random)" in proc.stdout and "dec tok/s" in proc.stdout


def test_energy_vad_cuts_at_the_pause():
    rate = 16000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(20 * rate) / rate)).astype(np.float32)
    pause = np.zeros(rate, dtype=np.float32)
    audio = np.concatenate([pause, tone, pause, tone, pause])  # 1 + 20 + 1 + 20 + 1 s
    assert speech_frames(audio).sum() == 2 * 20 * 50
    chunks = split_at_silences(audio)
    assert len(chunks) == 2
    for chunk, start in zip(chunks, (1.0, 22.0)):  # each tone, with 0.3 s of the pauses around it
        assert abs(chunk.start / rate - (start - 0.3)) < 0.03
        assert abs((chunk.end - chunk.start) / rate - 20.6) < 0.05
    # 45 s of continuous speech has no pause: cut hard at 30 s
    hard = split_at_silences(np.concatenate([tone, tone, tone[: 5 * rate]]))
    assert [round((c.end - c.start) / rate) for c in hard] == [30, 15]


def _read_ggml(path):
    """Walk a ggml file written by benchmarks/ggml_export.py: header, filters, vocabulary, tensor table."""
    import struct

    data = path.read_bytes()
    pos = 0

    def ints(n):
        nonlocal pos
        values = struct.unpack_from(f"<{n}i", data, pos)
        pos += 4 * n
        return values

    magic, *hparams = ints(12)
    rows, cols = ints(2)
    pos += 4 * rows * cols
    (n_tokens,) = ints(1)
    vocab = []
    for _ in range(n_tokens):
        (n,) = ints(1)
        vocab.append(data[pos : pos + n])
        pos += n
    tensors = {}
    while pos < len(data):
        n_dims, name_len, ftype = ints(3)
        shape = ints(n_dims)[::-1]
        name = data[pos : pos + name_len].decode()
        pos += name_len
        size = int(np.prod(shape)) * (2 if ftype else 4)
        tensors[name] = (shape, ftype, data[pos : pos + size])
        pos += size
    return magic, hparams, (rows, cols), vocab, tensors


def test_ggml_export_writes_every_tensor_in_whisper_cpp_layout(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ggml_export import GGML_MAGIC, write_ggml

    import whisperkv
    from whisperkv.weights.convert import convert

    pt = convert("tiny.en", tmp_path / "tiny.en.pt", "pt")
    magic, hparams, filters, vocab, tensors = _read_ggml(write_ggml(pt, tmp_path / "ggml.bin"))
    dims = whisperkv.model.KNOWN_DIMS["tiny.en"]
    assert magic == GGML_MAGIC
    assert hparams == [51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1]
    assert dims.n_vocab == hparams[0] and filters == (80, 201)
    assert len(vocab) == 50256 and vocab[0] == b"!" and vocab[220] == b" "
    import torch

    state = torch.load(pt, weights_only=True)["model_state_dict"]
    assert set(tensors) == set(state)
    shape, ftype, raw = tensors["decoder.token_embedding.weight"]
    assert shape == (51864, 384) and ftype == 1
    np.testing.assert_array_equal(
        np.frombuffer(raw, "<f2").reshape(shape),
        state["decoder.token_embedding.weight"].numpy().astype("<f2"),
    )
    assert tensors["encoder.conv1.bias"][:2] == ((384, 1), 0)  # conv biases as [n, 1] float32
    assert tensors["decoder.positional_embedding"][1] == 0 and tensors["decoder.ln.weight"][1] == 0


def test_utterance_file_is_shuffled_clips_with_pauses():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import SAMPLE_RATE, build_audio

    audios, refs = build_audio(min_long_seconds=1.0, min_utterance_seconds=60.0, seed=3)
    audio = audios["utterances"]
    assert 60 <= len(audio) / SAMPLE_RATE < 120
    quiet = np.abs(audio[: len(audio) // 160 * 160].reshape(-1, 160)).max(axis=1) == 0  # exact zeros: pauses
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(int), [0]]))))[::2]
    assert (runs >= 30).sum() >= 5  # at least five pauses of 0.3 s or more between utterances
    again, refs_again = build_audio(min_long_seconds=1.0, min_utterance_seconds=60.0, seed=3)
    assert refs_again["utterances"] == refs["utterances"]  # seeded: the same file every run
    other, refs_other = build_audio(min_long_seconds=1.0, min_utterance_seconds=60.0, seed=4)
    assert refs_other["utterances"] != refs["utterances"]  # another seed, another order


def test_goal_lines_split_an_int8_wer_gap_and_judge_the_step_on_tiny_en_only(capsys):
    """The int8 WER verdict carries each engine's float32 errors from the same run (the int8 cost apart
    from the float32 decodings' own gap); the 3 ms step goal is judged for tiny.en only."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import print_goals

    # words Whisper's English normaliser leaves alone (it reads "one two three" as one number)
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()
    ref = " ".join(words)
    texts = {
        "whisperkv-fp32": " ".join(words[:9]),  # 1 error
        "whisperkv-int8": " ".join(words[:8]),  # 2 errors
        "faster-whisper-fp32": ref,  # 0 errors
        "faster-whisper-int8": ref,  # 0 errors
    }
    step = {"steps": 100, "step_s": 0.35}  # 3.5 ms a step
    results = {
        (name, "long", "greedy"): [(1.0, {"text": text, **step}, 2**20)] for name, text in texts.items()
    }
    table = {key: 1.0 for key in results}
    print_goals(table, results, {"long": ref})
    out = capsys.readouterr().out
    wer_line = next(line for line in out.splitlines() if "int8 WER <= faster-whisper int8 WER" in line)
    assert "(2/10) vs 0.0% (0/10)  NOT met" in wer_line
    assert wer_line.endswith("float32 errors: ours 1 (int8 +1), faster-whisper 0 (int8 +0)")
    step_line = next(line for line in out.splitlines() if "fp32 decoder step <= 3 ms" in line)
    assert step_line.endswith("3.50  NOT met")
    print_goals(table, results, {"long": ref}, "base")
    assert "3.50  (tiny.en's goal; base shown)" in capsys.readouterr().out
    del results[("faster-whisper-fp32", "long", "greedy")]  # no float32 peer in the run: no split
    print_goals(table, results, {"long": ref})
    assert "float32 errors" not in capsys.readouterr().out


def test_serve_ceiling_is_audio_over_encoder_time_and_the_probe_runs(speech_dir):
    """benchmarks/serve.py's encoder-bound ceiling: audio seconds / (windows x the probe's seconds per
    window), the fraction reached against it, windows from the server's count or one per started 30 s;
    and the probe measures a positive time in a process of its own."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from serve_ceiling import EncoderCount, ceiling, probe
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    counted = ceiling(500.0, EncoderCount(10, 4.0), [5.0] * 10, audio_s=50.0, wall_s=6.0)
    assert counted.audio_per_s == 10.0 and counted.windows == 10 and counted.server_ms == 400.0
    assert abs(counted.fraction - (50.0 / 6.0) / 10.0) < 1e-12
    assert "0.83 of it" in counted.describe() and "counted by the server" in counted.describe()
    estimated = ceiling(500.0, EncoderCount(None, None), [5.0, 45.0, 60.0], audio_s=110.0, wall_s=4.0)
    assert estimated.windows == 1 + 2 + 2 and not estimated.counted and estimated.server_ms is None
    assert EncoderCount(12, 3.5).since(EncoderCount(2, 1.0)) == EncoderCount(10, 2.5)
    assert probe(ROOT, "default", [speech_dir / "en" / "jfk.flac"]) > 0


def test_stream_update_finds_every_part_it_times():
    """benchmarks/stream_update.py times a live update's parts by wrapping the functions that do them: each
    is found in this checkout (a part renamed away would drop from its table without a word), and a
    made-up path is not."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from stream_update import PARTS, locate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert [label for label, module, path in PARTS if locate(module, path) is None] == []
    assert locate("whisperkv.stream.local_decoder", "LocalDecoder.no_such_part") is None
    assert locate("whisperkv.stream.local_decoder", "NoSuchClass.decode") is None
