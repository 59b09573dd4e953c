"""Untrusted audio: which formats an upload may be opened as (told from its first bytes, never its name),
and how far its decode may go.

FFmpeg left to itself probes a file's bytes and name and picks any demuxer it has, and some of those
open other files or URLs named inside the input: HLS and other playlists, ``concat``/``ffconcat``
lists, image sequences, DASH manifests. Given a client's bytes, that would make the server read its own
disk. So a server upload is only ever opened with a demuxer this module chose from the content's magic
bytes, out of an allow-list of plain audio containers that read nothing but their own bytes; anything
else is refused, with what it looked like. Its decode is bounded too (:class:`DecodeBounds`): no
nested open, no packet or frame larger than real encoders make, no audio past the caller's limit.
The CLI does not use this: it opens what its user names.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import av

from whisperkv.errors import AudioError
from whisperkv.matroska_scan import oversized_element

#: the demuxers an upload may be read by: plain audio containers that read nothing but their own bytes
#: (PyAV reports a demuxer by its first name: "matroska" for "matroska,webm", "mov" for "mov,mp4,m4a,...")
ALLOWED_DEMUXERS = frozenset(
    {"wav", "w64", "flac", "mp3", "aac", "ogg", "matroska", "mov", "aiff", "caf", "au", "amr"}
)

#: what the refusal tells the client it may send
ACCEPTED_FORMATS = (
    "WAV/RF64/W64, FLAC, MP3, AAC (ADTS), Ogg (Opus, Vorbis, FLAC), WebM/Matroska, MP4/M4A/MOV, AIFF, CAF, "
    "AU, AMR"
)

#: private options per demuxer that keep it from reading anything outside the upload
_DEMUXER_OPTIONS = {"mov": {"enable_drefs": "0", "use_absolute_path": "0"}}

_ID3_HEADER = 10
_W64_RIFF_GUID = bytes.fromhex("726966662e91cf11a5d628db04c10000")  # "riff" + its GUID tail
_MP4_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot")
#: text that names other files or URLs, recognised so the refusal can say what it was
_LINKING_TEXT = (
    (b"#EXTM3U", "an HLS/M3U playlist (#EXTM3U)"),
    (b"ffconcat", "an ffconcat list"),
    (b"[playlist]", "a PLS playlist"),
    (b"#EXTCPLAYLIST", "a playlist"),
    (b"<?xml", "an XML document (a DASH manifest, SMIL or XSPF playlist...)"),
    (b"<", "markup (a manifest or playlist)"),
    (b"file ", "a concat list (file '...')"),
    (b"WEBVTT", "WebVTT subtitles"),
)


class UnsupportedUpload(ValueError):
    """The upload's bytes are not one of the accepted audio formats; ``what`` says what they look like."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"refused: {what}; only audio is accepted ({ACCEPTED_FORMATS})")


@dataclass(frozen=True)
class SniffedFormat:
    """The demuxer to force (``av.open(format=...)``) and its private options."""

    demuxer: str
    options: dict[str, str]


def sniff_audio_format(file: BinaryIO) -> SniffedFormat:
    """The accepted format whose signature starts ``file`` (read from its start; position restored)."""
    at = file.tell()
    try:
        file.seek(0)
        head = file.read(64)
        if head[:3] == b"ID3" and len(head) >= _ID3_HEADER:  # an ID3v2 tag in front: look behind it
            size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]  # syncsafe integer
            file.seek(_ID3_HEADER + size + (10 if head[5] & 0x10 else 0))
            behind = file.read(64)
            demuxer = "flac" if behind[:4] == b"fLaC" else _mpeg_audio(behind) or "mp3"
        else:
            demuxer = _demuxer_for(head)
    finally:
        file.seek(at)
    return SniffedFormat(demuxer, dict(_DEMUXER_OPTIONS.get(demuxer, {})))


def _demuxer_for(head: bytes) -> str:
    if head[8:12] == b"WAVE" and head[:4] in (b"RIFF", b"RF64", b"BW64"):
        return "wav"
    if head[:16] == _W64_RIFF_GUID:
        return "w64"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[4:8] in _MP4_BOXES:
        return "mov"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"caff":
        return "caf"
    if head[:4] == b".snd":
        return "au"
    if head[:6] == b"#!AMR\n" or head[:9] == b"#!AMR-WB\n":
        return "amr"
    if (mpeg := _mpeg_audio(head)) is not None:
        return mpeg
    raise UnsupportedUpload(_describe(head))


def _mpeg_audio(head: bytes) -> str | None:
    """The demuxer "mp3" for an MPEG audio frame header (layers I-III), "aac" for an ADTS one, else None."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    if head[1] & 0xF6 == 0xF0:  # 12-bit sync, layer 00: ADTS
        return "aac"
    version, layer = (head[1] >> 3) & 0x3, (head[1] >> 1) & 0x3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 0x3
    if version == 1 or layer == 0 or bitrate == 0xF or rate == 0x3:  # reserved values: not a frame
        return None
    return "mp3"


def _describe(head: bytes) -> str:
    """What a refused upload looks like, for the error message."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    for signature, what in _LINKING_TEXT:
        if text.startswith(signature):
            return what
    if not head:
        return "an empty file"
    if all(32 <= b < 127 or b in b"\t\r\n" for b in head):
        return "text, not audio"
    return f"no known audio signature (starts {head[:8].hex(' ')})"


# --- How far a decode of untrusted bytes may go ---------------------------------------------------------

#: the largest packet and the longest frame (at its own rate) untrusted bytes may have: far above any
#: real encoder's (FLAC's largest frame is 65535 samples; PCM is muxed in blocks of milliseconds), and
#: what keeps one decode's memory bounded when a container puts all its audio in one packet
MAX_PACKET_BYTES = 8 * 2**20
_MATROSKA_BLOCKS = (0xA3, 0xA1)  # SimpleBlock, Block: one packet each (several when laced)
MAX_FRAME_S = 30.0


class AudioTooLongError(AudioError):
    """The audio goes on past the longest a caller accepts (found while decoding, which then stops)."""

    def __init__(self, source: str, limit_s: float) -> None:
        self.limit_s = limit_s
        super().__init__(source, f"longer than {limit_s:g} s")


class NestedOpenRefused(PermissionError):
    """A demuxer asked to open another file or URL named inside an untrusted input."""


class NestedOpenGuard:
    """PyAV's ``io_open`` hook for untrusted input: every file or URL the input names is answered with no
    bytes at all (raising in the hook would print PyAV's traceback), and remembered, so the open can
    then be refused by name (:meth:`refuse_if_asked`)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, url: str, flags: int, options: dict) -> io.BytesIO:
        self.asked.append(url)
        return io.BytesIO(b"")

    def refuse_if_asked(self) -> None:
        if self.asked:
            raise NestedOpenRefused(f"refused to open {self.asked[0][:200]!r}, which the upload names")


@dataclass(frozen=True)
class DecodeBounds:
    """What one decode of untrusted bytes may reach: ``max_samples`` at ``sr``, one packet, one frame."""

    max_samples: int | None
    sr: int

    def check_structure(self, source: str, demuxer: str, reopen: Callable[[], BinaryIO]) -> None:
        """Before FFmpeg reads anything: a Matroska/WebM element it would read whole (a block, a track's
        codec data, attachments) over ``MAX_PACKET_BYTES`` is refused from its header alone."""
        if demuxer != "matroska":
            return
        with reopen() as file:
            found = oversized_element(file, MAX_PACKET_BYTES)
        if found is not None:
            element, size, at = found
            what = (
                "a packet" if element in _MATROSKA_BLOCKS else f"an element (ID 0x{element:X}) at byte {at}"
            )
            raise AudioError(
                source, f"{what} of {size / 2**20:.1f} MB (at most {MAX_PACKET_BYTES // 2**20} MB accepted)"
            )

    def check_packet(self, source: str, packet: av.Packet) -> None:
        if packet.size > MAX_PACKET_BYTES:
            raise AudioError(
                source,
                f"a packet of {packet.size / 2**20:.1f} MB (at most {MAX_PACKET_BYTES // 2**20} MB accepted)",
            )

    def check_frame(self, source: str, frame: av.AudioFrame) -> None:
        if frame.samples > MAX_FRAME_S * frame.sample_rate:
            raise AudioError(
                source,
                f"a frame of {frame.samples / frame.sample_rate:.1f} s (at most {MAX_FRAME_S:g} s accepted)",
            )

    def check_length(self, source: str, produced: int) -> None:
        if self.max_samples is not None and produced > self.max_samples:
            raise AudioTooLongError(source, self.max_samples / self.sr)
