"""The pictures of a trace, one function per stage, drawn with matplotlib's Agg backend into PNG files.

Every figure is sized for a laptop screen (about 11 in wide at 110 dpi) and uses plain colour maps that
print legibly in grey.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from whisperkv.audio import HOP_LENGTH, SAMPLE_RATE  # noqa: E402

if TYPE_CHECKING:
    from whisperkv.explain.trace import Trace

WIDTH, DPI = 11.0, 110
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 log-Mel frames per second


def _save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=DPI)
    plt.close(fig)
    return name


def waveform(trace: Trace, out: Path) -> str:
    """The whole recording with the explained window shaded."""
    audio = trace.waveform
    step = max(1, len(audio) // 20000)  # min/max envelope: every peak survives the downsampling
    n = len(audio) // step * step
    blocks = audio[:n].reshape(-1, step) if n else audio[None, :1]
    t = np.arange(len(blocks)) * step / SAMPLE_RATE
    fig, ax = plt.subplots(figsize=(WIDTH, 2.4))
    ax.fill_between(t, blocks.min(axis=1), blocks.max(axis=1), color="#345", linewidth=0)
    start, end = trace.window_seconds
    ax.axvspan(start, start + 30.0, color="#f0a020", alpha=0.25, label=f"window {trace.window_index} (30 s)")
    ax.axvline(end, color="#c05000", linewidth=1, label="audio in the window ends")
    ax.set(xlabel="seconds", ylabel="amplitude", xlim=(0, max(len(audio) / SAMPLE_RATE, start + 30.0)))
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, out, "waveform.png")


def log_mel(trace: Trace, out: Path) -> str:
    """The encoder's input: n_mels × 3,000 frames; the zero padding after the audio is marked."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
    image = ax.imshow(trace.mel, aspect="auto", origin="lower", cmap="magma", interpolation="nearest")
    ax.axvline(trace.content_frames, color="cyan", linewidth=1.2)
    if trace.content_frames < trace.mel.shape[1]:
        ax.text(
            trace.content_frames + 20,
            trace.mel.shape[0] * 0.85,
            "padding (silence)",
            color="cyan",
            fontsize=9,
        )
    ax.set(xlabel=f"log-Mel frame (100 per second; audio ends at {trace.content_frames})", ylabel="Mel bin")
    fig.colorbar(image, ax=ax, pad=0.01, label="log-Mel (scaled)")
    return _save(fig, out, "log_mel.png")


def encoder_output(trace: Trace, out: Path) -> str:
    """The encoder output H: 1,500 positions (20 ms each) × d channels."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
    limit = float(np.percentile(np.abs(trace.features), 99)) or 1.0
    image = ax.imshow(
        trace.features.T,
        aspect="auto",
        origin="lower",
        cmap="RdBu_r",
        vmin=-limit,
        vmax=limit,
        interpolation="nearest",
    )
    ax.axvline(trace.content_frames / 2, color="black", linewidth=1)
    ax.set(xlabel="encoder position (20 ms each)", ylabel="channel")
    fig.colorbar(image, ax=ax, pad=0.01, label="activation (clipped at the 99th percentile)")
    return _save(fig, out, "encoder_output.png")


def cross_attention(trace: Trace, out: Path) -> str:
    """The alignment heads' cross-attention per text token, with the words' timestamps on the time axis."""
    matrix = trace.alignment
    rows = max(len(trace.alignment_tokens), 1)
    fig, ax = plt.subplots(figsize=(WIDTH, min(2.0 + 0.16 * rows, 9.0)))
    start, _ = trace.window_seconds
    if matrix.size:
        extent = (start, start + matrix.shape[1] / 50.0, rows - 0.5, -0.5)
        ax.imshow(matrix, aspect="auto", cmap="viridis", extent=extent, interpolation="nearest")
    ax.set_yticks(range(rows))
    ax.set_yticklabels(trace.alignment_tokens, fontsize=7)
    for word in trace.words:
        ax.axvspan(word["start"], word["end"], color="white", alpha=0.12)
        ax.text(
            (word["start"] + word["end"]) / 2,
            -0.9,
            word["word"].strip(),
            ha="center",
            va="bottom",
            fontsize=7,
            rotation=60,
        )
    ax.set(xlabel="seconds (words from word timestamps shaded)", ylabel="token")
    return _save(fig, out, "cross_attention.png")


def cache_growth(trace: Trace, out: Path) -> str:
    """Self-KV bytes per decoder call (stacked by layer) above the flat Cross-KV; beam reorders marked.

    Two panels with their own scales: a tiny.en window's Self-KV ends near 0.3 MiB, its Cross-KV is 17.6 MiB.
    """
    selfs = np.array(trace.self_kv_bytes, dtype=float) / 2**10
    calls = np.arange(len(selfs))
    crosses = np.array(trace.cross_kv_bytes, dtype=float) / 2**20
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH, 4.4), sharex=True, height_ratios=(3, 2))
    if len(selfs):
        top.stackplot(calls, selfs.T, labels=[f"layer {i}" for i in range(selfs.shape[1])], alpha=0.85)
        bottom.stackplot(
            calls,
            np.repeat(crosses[:, None], len(calls), axis=1),
            labels=[f"layer {i}" for i in range(len(crosses))],
            alpha=0.85,
        )
    for i, step in enumerate(trace.reorders):
        top.axvline(step, color="red", alpha=0.35, linewidth=0.8, label="beam reorder" if i == 0 else None)
    top.set(
        ylabel="Self-KV, KiB", title="Self-KV grows with every token; Cross-KV is projected once and stays"
    )
    bottom.set(xlabel="decoder call (0 = the whole prompt)", ylabel="Cross-KV, MiB")
    top.legend(loc="upper left", fontsize=7, ncol=3)
    return _save(fig, out, "cache_growth.png")


def waterfall(trace: Trace, out: Path) -> str:
    """Where the time went: log-Mel, encoder, Cross-KV projection, then every decoder step, end to end."""
    t = trace.timings_ms
    stages = [
        ("log-Mel (whole file)", t["log_mel_whole_file"]),
        ("encoder", t["encoder"]),
        ("Cross-KV projection", t["cross_kv_projection"]),
    ]
    stages += [(f"step {i}", ms) for i, ms in enumerate(t["decoder_steps"])]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.0))
    left = 0.0
    colours = {"log-Mel (whole file)": "#4a7", "encoder": "#37a", "Cross-KV projection": "#a73"}
    for name, ms in stages:
        ax.barh(
            0 if name in colours else 1,
            ms,
            left=left,
            color=colours.get(name, "#888"),
            edgecolor="white",
            linewidth=0.3,
        )
        left += ms
    for name, ms in stages[:3]:
        ax.barh(0, 0, color=colours[name], label=f"{name}: {ms:.1f} ms")
    steps = t["decoder_steps"]
    ax.barh(
        1,
        0,
        color="#888",
        label=f"{len(steps)} decoder steps: {sum(steps):.1f} ms "
        f"(median {np.median(steps) if steps else 0:.2f} ms)",
    )
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["audio side", "decoder"])
    ax.set(xlabel="milliseconds since the start of the window's work")
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, out, "waterfall.png")


def draw_all(trace: Trace, out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    return {
        "waveform": waveform(trace, out),
        "log_mel": log_mel(trace, out),
        "encoder_output": encoder_output(trace, out),
        "cross_attention": cross_attention(trace, out),
        "cache_growth": cache_growth(trace, out),
        "waterfall": waterfall(trace, out),
    }
