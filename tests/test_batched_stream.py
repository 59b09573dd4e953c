"""`--batched True` shows what the sequential mode shows (segments as they are decided, with verbose),
and reads its audio forward once, keeping only the samples of the windows still to decode."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import whisperkv
import whisperkv.batched as batched_module
from whisperkv import cli
from whisperkv.audio import SAMPLE_RATE
from whisperkv.batched import transcribe_batched
from whisperkv.batched_order import ForwardSamples, WindowQueue
from whisperkv.chunking import Chunk
from whisperkv.writers import format_timestamp

CLIPS = ["lj_LJ001-0001.flac", "lj_LJ001-0003.flac", "lj_LJ001-0005.flac", "lj_LJ001-0007.flac"]
LINE = re.compile(r"^\[(\d\d:\d\d\.\d\d\d) --> (\d\d:\d\d\.\d\d\d)\] (.*)$")


@pytest.fixture(scope="module")
def joined(speech_dir):
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    parts = []
    for name in CLIPS:
        parts += [whisperkv.load_audio(speech_dir / "en" / name), gap]
    return np.concatenate(parts)


def test_verbose_prints_every_segment_in_order_as_its_chunk_is_decoded(
    tiny_model, joined, capsys, monkeypatch
):
    seen: list[str] = []  # lines printed so far
    before: list[int] = []  # lines printed before each batch was decoded
    decode = batched_module.decode_windows

    def counting(*args, **kwargs):
        seen.extend(capsys.readouterr().out.splitlines())
        before.append(len(seen))
        return decode(*args, **kwargs)

    monkeypatch.setattr(batched_module, "decode_windows", counting)
    capsys.readouterr()
    result = transcribe_batched(tiny_model, joined, batch_size=1, verbose=True)
    seen.extend(capsys.readouterr().out.splitlines())
    expected = [
        f"[{format_timestamp(s['start'])} --> {format_timestamp(s['end'])}] {s['text']}"
        for s in result["segments"]
    ]
    assert seen == expected and len(expected) >= len(CLIPS)  # each once, in time order
    assert len(before) == result["batched"]["windows"] >= 2
    assert before[-1] > 0  # shown before the last batch was decoded, not at the end
    for verbose in (False, None):
        transcribe_batched(tiny_model, joined, verbose=verbose)
        assert capsys.readouterr().out == ""


def test_cli_batched_prints_segments_with_verbose_and_nothing_without(
    tiny_model, speech_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(cli, "_load", lambda args: tiny_model)
    clip = speech_dir / "en" / "jfk.flac"
    greedy = ["--beam_size", "None", "--best_of", "None", "-f", "txt", "-o", str(tmp_path)]
    capsys.readouterr()
    assert cli.main(["transcribe", str(clip), "--batched", "True", *greedy]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and all(LINE.match(line) for line in out)
    assert "ask not what your country can do for you" in " ".join(out)
    assert cli.main(["transcribe", str(clip), "--batched", "True", "--verbose", "False", *greedy]) == 0
    assert capsys.readouterr().out == ""


class _Recorded:
    """A source (sample i has the value i) that records every read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads: list[tuple[int, int]] = []

    def samples(self, start: int, stop: int) -> torch.Tensor:
        self.reads.append((start, stop))
        return self.expected(start, stop)

    def expected(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, min(stop, self.n), dtype=torch.float64)


def test_forward_samples_read_the_source_forward_once_and_keep_only_the_queued_windows():
    source = _Recorded(10**9)  # every window below lies inside it
    reader = ForwardSamples(source)
    rng = np.random.default_rng(0)
    queued: list[tuple[int, int]] = []  # windows read once and to be read again (rests)
    at = 0
    for _ in range(60):  # a batch: the queued rests, then new windows further on
        new = []
        for _ in range(int(rng.integers(1, 8))):
            at += int(rng.integers(0, 40_000))  # silence between chunks: skipped
            new.append((at, at + int(rng.integers(1, 480_000))))
            at = new[-1][1]
        for start, stop in queued + new:
            assert torch.equal(reader.samples(start, stop), source.expected(start, stop))
        queued = [(s + (e - s) // 2, e) for s, e in new if rng.random() < 0.3]  # their rests
        reader.keep_only(queued)
        held = sum(len(span) for _, span in reader.spans)
        assert held <= sum(e - s for s, e in queued)  # nothing but the windows still to decode
    forward = all(a >= b for (a, _), (_, b) in zip(source.reads[1:], source.reads))
    assert forward  # each read starts where an earlier one stopped or later: never decoded again


def test_queue_gives_the_earliest_windows_first_and_counts_each_chunk():
    chunks = [Chunk(i * 100, i * 100 + 90) for i in range(5)]
    queue = WindowQueue(chunks)
    first = queue.take_batch(2)
    assert [p.seek for p in first] == [0, 100]
    queue.push(first[0].chunk, 50, 1, first[0].origin)  # a rest of chunk 0
    for p in first:
        queue.done(p)
    assert queue.open[0] == 1 and queue.open[1] == 0
    second = queue.take_batch(2)
    assert [p.seek for p in second] == [50, 200]  # the rest joins the next batch, before later chunks
