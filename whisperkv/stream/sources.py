"""Where a stream's samples come from: a whole file (decoded once) or raw PCM on a pipe.

``PCMPipe`` reads s16le 16 kHz mono as it arrives; a pipe may deliver an odd number of bytes in one
read, so a lone byte waits for the next read. Only an odd total at the end of input is an error: the
stray byte is dropped, everything before it is still transcribed, and ``error`` says what was wrong.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import numpy as np

from whisperkv.audio import load_audio
from whisperkv.stream.pcm import pcm16_to_float


class FileSamples:
    def __init__(self, path: str | os.PathLike) -> None:
        self.samples = load_audio(path)  # AudioError names the file when it is not audio
        self.position = 0
        self.error: str | None = None

    def read(self, n: int) -> np.ndarray:
        out = self.samples[self.position : self.position + n]
        self.position += len(out)
        return out


class PCMPipe:
    def __init__(self, stream: BinaryIO, name: str = "stdin") -> None:
        self.stream = stream
        self.name = name
        self.carry = b""
        self.error: str | None = None

    def read(self, n: int) -> np.ndarray:
        data = self.carry
        while len(data) < 2 * n:
            more = self.stream.read(2 * n - len(data))
            if not more:
                break
            data += more
        if len(data) < 2 * n and len(data) % 2:  # end of input with a stray byte
            self.error = (
                f"{self.name}: odd number of bytes at the end of input: not 16-bit PCM (last byte dropped)"
            )
            data = data[:-1]
        self.carry = data[2 * n :]
        return pcm16_to_float(data[: 2 * n])
