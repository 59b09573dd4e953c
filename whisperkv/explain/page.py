"""The trace as one plain HTML page (no JavaScript): the seven stages top to bottom, images beside it."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from whisperkv.audio import SAMPLE_RATE

if TYPE_CHECKING:
    from whisperkv.explain.trace import Trace

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1240px; margin: 1.5em auto; padding: 0 1em;
       color: #1b1b1b; }
h1 { font-size: 1.5em; margin-bottom: .2em; }
h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.prompt td { color: #777; background: #fafafa; } tr.timestamp td { background: #eef5ff; }
tr.special td { background: #fff4e0; } code { font-size: 12px; } .ok { color: #060; } .bad { color: #a00; }
.meta { color: #555; font-size: 13px; }
@media print { body { max-width: none; } h2 { break-after: avoid; } img { break-inside: avoid; } }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _steps_table(trace: Trace) -> str:
    rows = [
        "<tr><th>position</th><th>token</th><th>text</th><th>kind</th><th>probability</th>"
        "<th>top five alternatives</th></tr>"
    ]
    for position, (token, text) in enumerate(trace.prompt):
        rows.append(
            f'<tr class="prompt"><td class="num">{position}</td><td class="num">{token}</td>'
            f"<td><code>{_e(text)}</code></td><td>prompt</td><td></td><td></td></tr>"
        )
    for s in trace.steps:
        top = ", ".join(f"<code>{_e(text)}</code> {p:.3f}" for _, text, p in s.top)
        rows.append(
            f'<tr class="{s.kind}"><td class="num">{s.position}</td><td class="num">{s.token}</td>'
            f'<td><code>{_e(s.text)}</code></td><td>{s.kind}</td><td class="num">{s.probability:.4f}</td>'
            f"<td>{top}</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _cache_table(trace: Trace) -> str:
    final = trace.self_kv_bytes[-1] if trace.self_kv_bytes else []
    rows = ["<tr><th>layer</th><th>Self-KV at the end</th><th>Cross-KV (constant)</th></tr>"]
    for layer, (s, c) in enumerate(zip(final, trace.cross_kv_bytes)):
        rows.append(
            f'<tr><td class="num">{layer}</td><td class="num">{s:,} B</td><td class="num">{c:,} B</td></tr>'
        )
    rows.append(
        f'<tr><th>total</th><td class="num">{sum(final):,} B ({_mib(sum(final))})</td>'
        f'<td class="num">{sum(trace.cross_kv_bytes):,} B ({_mib(sum(trace.cross_kv_bytes))})</td></tr>'
    )
    return "<table>" + "".join(rows) + "</table>"


def render_page(trace: Trace, images: dict[str, str]) -> str:
    start, end = trace.window_seconds
    t = trace.timings_ms
    steps_ms = t["decoder_steps"]
    match = {
        True: '<span class="ok">identical to transcription</span>',
        False: '<span class="bad">DIFFERENT from transcription</span>',
        None: "sampled at temperature &gt; 0 in transcription: the replay is greedy and may differ",
    }
    prov = "".join(
        f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in trace.provenance.items()
    )
    words = ", ".join(
        f"<code>{_e(w['word'].strip())}</code> {w['start']:.2f}–{w['end']:.2f} s" for w in trace.words
    )
    reorder_note = (
        f"Beam search moved Self-KV rows after {len(trace.reorders)} of {len(trace.self_kv_bytes)} "
        "decoder calls (red lines)."
        if trace.beam_size
        else "Greedy decoding: one row, no reorders."
    )
    search = f"beam search, {trace.beam_size} beams" if trace.beam_size else "greedy"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>whisperkv explain: {_e(trace.file)}</title>
<style>{CSS}</style></head><body>
<h1>How Whisper heard <code>{_e(trace.file)}</code></h1>
<p class="meta">model {_e(trace.model)} · weights <code>{_e(trace.weights_digest)}</code>
· language {_e(trace.language)} · {search} · window {trace.window_index} of {trace.n_windows} decoded
· {trace.n_samples / SAMPLE_RATE:.2f} s of audio</p>

<h2>1. The waveform</h2>
<p>16 kHz mono samples. The shaded band is the 30 s window explained below; it starts at {start:.2f} s and
holds audio up to {end:.2f} s.</p>
<img src="{images["waveform"]}" alt="waveform with the window marked">

<h2>2. The log-Mel spectrogram (the encoder's input)</h2>
<p>{trace.mel.shape[0]} Mel bins × {trace.mel.shape[1]} frames of 10 ms. {trace.content_frames} frames hold
audio; the rest is zero padding (the cyan line), because the encoder always sees exactly 30 s.</p>
<img src="{images["log_mel"]}" alt="log-Mel spectrogram">

<h2>3. The encoder output</h2>
<p>{trace.features.shape[0]} positions (20 ms each) × {trace.features.shape[1]} channels, computed in
{t["encoder"]:.1f} ms. Its provenance — what every cache built from it is tied to:</p>
<table>{prov}</table>
<img src="{images["encoder_output"]}" alt="encoder output heat map">

<h2>4. Decoding, step by step</h2>
<p>Grey rows are the prompt (previous text, start of transcript, language, task); then one row per sampled
token, with the probability the search saw after the logit filters and the five most probable choices.
Replayed tokens: {match[trace.tokens_match]}. Average log-probability {trace.avg_logprob:.4f}.</p>
{_steps_table(trace)}

<h2>5. Cross-attention behind word timestamps</h2>
<p>The alignment heads' attention from each text token to the audio (normalised, median-filtered). Dynamic
time warping through this picture gives the words' times: {words or "no words"}.</p>
<img src="{images["cross_attention"]}" alt="cross-attention of the alignment heads">

<h2>6. The two caches</h2>
<p>Self-KV grows by one position per layer with every token; Cross-KV is projected once
({t["cross_kv_projection"]:.1f} ms) and never rewritten. Bytes are 2·B·T·d·s per layer, as <code>whisperkv
inspect</code> counts them. {reorder_note}</p>
{_cache_table(trace)}
<img src="{images["cache_growth"]}" alt="cache growth per step">

<h2>7. Where the time went</h2>
<p>log-Mel of the whole file {t["log_mel_whole_file"]:.1f} ms, encoder {t["encoder"]:.1f} ms, Cross-KV
{t["cross_kv_projection"]:.1f} ms, {len(steps_ms)} decoder calls {sum(steps_ms):.1f} ms (the first one runs
the whole prompt).</p>
<img src="{images["waterfall"]}" alt="time waterfall">
</body></html>
"""
