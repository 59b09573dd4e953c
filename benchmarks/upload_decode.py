"""What reading a long recording costs before the model sees it: decoding once (spooled) against again.

    PYTHONPATH=. .venv/bin/python benchmarks/upload_decode.py               # both long files, FLAC and MP3
    PYTHONPATH=. .venv/bin/python benchmarks/upload_decode.py --rounds 7

For each long-form file of ../shared/data/speech (FLAC as shipped, and the same audio as a 64 kbit/s MP3
made once here with PyAV), the seconds from bytes to the last window's log-Mel frames, the way each path
reads it:
- server: ``open_upload`` (the length check, the scan) then every 30 s window's frames and samples, with
  the decoded samples spooled (one decode) and with the spool off (three decodes, as before the spool);
- CLI: ``FileSource(path)`` (the scan) then every window, spooled (one decode) and not (two decodes).
Rounds interleave the variants; medians are printed with the decode counts. No model is loaded.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import av
import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
UPLOAD_LIMIT = 100 * 2**20


def _mp3(path: Path, directory: Path) -> Path:
    from whisperkv.audio import load_audio

    samples = (load_audio(path) * 32767).astype(np.int16)
    out_path = directory / (path.stem + ".mp3")
    with av.open(str(out_path), "w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=16000, bit_rate=64000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), "s16", "mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return out_path


def _read_windows(source) -> None:  # noqa: ANN001 - a FileSource
    from whisperkv.audio import N_FRAMES

    for seek in range(0, source.content_frames, N_FRAMES):
        source.mel(seek, seek + N_FRAMES)
        source.samples(seek * 160, (seek + N_FRAMES) * 160)


def _server(path: Path, spool: bool) -> tuple[float, int]:
    import whisperkv.serve.upload as upload

    class Upload:
        filename = path.name
        file = io.BytesIO(path.read_bytes())

    calls = []
    real = upload.decode_untrusted
    upload.decode_untrusted = lambda *a, **k: calls.append(1) or real(*a, **k)
    upload.SPOOL_PER_UPLOAD_BYTE = 2 if spool else 0
    try:
        started = time.perf_counter()
        _read_windows(upload.open_upload(Upload(), UPLOAD_LIMIT, 10800, 80))
        return time.perf_counter() - started, len(calls)
    finally:
        upload.decode_untrusted, upload.SPOOL_PER_UPLOAD_BYTE = real, 2


def _cli(path: Path, spool: bool) -> tuple[float, int]:
    from whisperkv.audio_source import FileSource

    started = time.perf_counter()
    source = FileSource(path, 80, spool_bytes=256 * 2**20 if spool else 0)
    _read_windows(source)
    return time.perf_counter() - started, source.decodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start (shared machine)")
    with tempfile.TemporaryDirectory() as directory:
        files = sorted((SPEECH / "long").glob("*.flac"))
        files += [_mp3(f, Path(directory)) for f in files]
        variants = {
            "server, spooled": lambda p: _server(p, True),
            "server, decoded again": lambda p: _server(p, False),
            "CLI, spooled": lambda p: _cli(p, True),
            "CLI, decoded again": lambda p: _cli(p, False),
        }
        for path in files:
            times: dict[str, list[float]] = {name: [] for name in variants}
            counts: dict[str, int] = {}
            for _ in range(args.rounds):
                for name, run in variants.items():
                    seconds, counts[name] = run(path)
                    times[name].append(seconds)
            print(f"\n{path.name} ({path.stat().st_size / 2**20:.1f} MB), median of {args.rounds} rounds:")
            for name in variants:
                print(f"  {name:<24}{statistics.median(times[name]):7.3f} s  ({counts[name]} decodes)")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
