"""What a person watching a long batch wants to see: files done of total, audio hours, speed, ETA —
then one summary, whether or not a terminal is attached."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import tqdm


@dataclass
class Progress:
    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    audio_seconds: float = 0.0  # audio transcribed in this run (skipped files not counted)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.bar = tqdm.tqdm(
            total=self.total, unit="file", file=self.stream, disable=not self.stream.isatty(), leave=False
        )

    def add(self, record: dict, skipped: bool = False) -> None:
        if skipped:
            self.skipped += 1
        elif record.get("error"):
            self.failed += 1
            self.bar.write(f"whisperkv batch: error: {record['error']}", file=self.stream)
        else:
            self.ok += 1
            self.audio_seconds += float(record.get("duration") or 0.0)
        wall = time.perf_counter() - self.started
        speed = self.audio_seconds / wall if wall > 0 else 0.0
        self.bar.set_postfix_str(f"{self.audio_seconds / 3600:.3f} h audio, {speed:.1f}x real time")
        self.bar.update(1)

    def summary(self) -> dict:
        wall = time.perf_counter() - self.started
        return {
            "files": self.total,
            "ok": self.ok,
            "failed": self.failed,
            "skipped": self.skipped,
            "audio_hours": round(self.audio_seconds / 3600, 4),
            "wall_seconds": round(wall, 2),
            "real_time_factor": round(wall / self.audio_seconds, 4) if self.audio_seconds else None,
        }

    def close(self) -> dict:
        self.bar.close()
        s = self.summary()
        rtf = f"{s['real_time_factor']:.3f}" if s["real_time_factor"] is not None else "-"
        print(
            f"whisperkv batch: {s['ok']} ok, {s['failed']} failed, {s['skipped']} skipped of {s['files']} "
            f"files; {s['audio_hours']:.3f} h of audio in {s['wall_seconds']:.1f} s (real-time factor {rtf})",
            file=self.stream,
            flush=True,
        )
        return s
