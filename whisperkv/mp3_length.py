"""How long an MP3 says it is: the frame count in its Xing/Info or VBRI header, when it has one.

An MP3 is a plain run of frames with no length field, so a file cut in half decodes cleanly as half
the audio. Encoders that write a Xing/Info frame (LAME, FFmpeg's libmp3lame: every VBR file and most
CBR ones) or a VBRI frame (Fraunhofer) put the number of audio frames in it, which is what a
truncation check can compare the decoded length against. A CBR file without such a frame carries no
length at all (FFmpeg's duration for it is an estimate from the file size), so its truncation cannot
be detected.
"""

from __future__ import annotations

import contextlib
import os
from typing import BinaryIO

_SAMPLES_PER_FRAME = {3: 1152, 2: 576, 0: 576}  # Layer III, by version id: MPEG-1, MPEG-2, MPEG-2.5
_SEARCH_BYTES = 4096  # how far past the ID3v2 tag the first frame may start (junk, padding)


def declared_mp3_samples(path: str | os.PathLike | BinaryIO) -> int | None:
    """Samples per channel, at the file's own rate, that the Xing/Info or VBRI frame counts; else None.

    The count includes the encoder's delay and padding (which the decoder trims), so a complete file
    decodes to slightly fewer samples — at most a couple of frames fewer. ``path`` may be an open binary
    file (read from its start; not closed).
    """
    try:
        with open(path, "rb") if isinstance(path, (str, os.PathLike)) else contextlib.nullcontext(path) as f:
            head = f.read(10)
            if head[:3] == b"ID3" and len(head) == 10:
                size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]  # syncsafe integer
                f.seek(10 + size + (10 if head[5] & 0x10 else 0))  # flag 0x10: a footer follows
            else:
                f.seek(0)
            data = f.read(_SEARCH_BYTES + 256)
    except OSError:
        return None
    for at in range(min(len(data) - 4, _SEARCH_BYTES)):
        if data[at] == 0xFF and data[at + 1] & 0xE0 == 0xE0:
            return _frames_in_info_frame(data[at:])
    return None


def _frames_in_info_frame(frame: bytes) -> int | None:
    """The sample count from the Xing/Info or VBRI frame starting at ``frame[0]``, if it is one."""
    version = (frame[1] >> 3) & 0x3
    layer = (frame[1] >> 1) & 0x3
    if layer != 1 or version not in _SAMPLES_PER_FRAME:  # only Layer III carries these frames
        return None
    mono = frame[3] >> 6 == 3
    side_info = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    xing = 4 + side_info
    if frame[xing : xing + 4] in (b"Xing", b"Info"):
        flags = int.from_bytes(frame[xing + 4 : xing + 8], "big")
        if flags & 0x1:  # the frame-count field is present
            frames = int.from_bytes(frame[xing + 8 : xing + 12], "big")
            return frames * _SAMPLES_PER_FRAME[version] if frames else None
        return None
    vbri = 4 + 32
    if frame[vbri : vbri + 4] == b"VBRI":
        frames = int.from_bytes(frame[vbri + 14 : vbri + 18], "big")
        return frames * _SAMPLES_PER_FRAME[version] if frames else None
    return None
