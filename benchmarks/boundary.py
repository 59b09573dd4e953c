"""What each stage of a split pipeline costs per 30 s window, and which side should project Cross-KV.

    .venv/bin/python benchmarks/boundary.py                    # tiny.en and base, 5 interleaved rounds
    .venv/bin/python benchmarks/boundary.py --models tiny.en --rounds 3 --json

For each model three paths encode the same windows, interleaved round by round (local, features,
cross_kv, local, ...): in process (``LocalEncoder``), and through a ``whisperkv encoder-worker``
process on 127.0.0.1 that sends back the sealed encoder output (``features``: the decoder projects the
Cross-KV) or every layer's sealed Cross-KV (``cross_kv``: the worker projects it). Each window is then
decoded greedily here. Printed: medians over rounds and windows of every stage (log-Mel, encoder, Cross-KV
projection and its side, sealing, transfer, opening, decoding, per token), the bytes that cross, and the
decision the figures imply. Both processes share this machine, so "transfer" is loopback HTTP: a real
boundary (another VM, an enclave's untrusted I/O) adds its network time to every byte counted here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT.parent / "shared" / "data" / "speech"
DEFAULT_AUDIO = SPEECH / "long" / "lj001_0001-0032_concat.flac"
STAGES = ("log_mel_ms", "encoder_ms", "projection_ms", "seal_ms", "transfer_ms", "open_ms", "decode_ms")


def start_worker(model: str, carry: str, secret_file: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "whisperkv", "encoder-worker", "--model", model, "--port", str(port)]
    cmd += ["--secret_file", secret_file, "--carry", carry]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"encoder worker for {model}/{carry} did not start")


def measure_model(name: str, audio, windows: int, rounds: int, secret: bytes, secret_file: str) -> list[dict]:
    import whisperkv
    from whisperkv.audio import N_SAMPLES, log_mel_spectrogram, pad_or_trim
    from whisperkv.boundary.client import RemoteEncoder
    from whisperkv.cache.store import CacheStore
    from whisperkv.decoding.decode import decode_window
    from whisperkv.decoding.options import DecodingOptions
    from whisperkv.local_encoder import LocalEncoder

    model = whisperkv.load_model(name)
    tokenizer = model.tokenizer.with_options(language="en", task="transcribe")
    options = DecodingOptions(language="en")
    workers = {carry: start_worker(name, carry, secret_file) for carry in ("features", "cross_kv")}
    rows: list[dict] = []
    try:
        encoders = {
            "local": LocalEncoder(),
            **{carry: RemoteEncoder(url, secret, carry=carry) for carry, (_, url) in workers.items()},
        }
        for rnd in range(rounds + 1):  # round 0 warms every path up and is not counted
            for encoder in encoders.values():
                store = CacheStore(encoder, max_entries=1)
                for w in range(windows):
                    start = w * N_SAMPLES
                    samples = audio[start : start + N_SAMPLES]
                    t0 = time.perf_counter()
                    mel = pad_or_trim(log_mel_spectrogram(samples, model.dims.n_mels), 3000)
                    log_mel_ms = (time.perf_counter() - t0) * 1000
                    window = store.encode(model, mel, start, start + samples.shape[0], "benchmark")
                    result = decode_window(
                        model, tokenizer, window.audio_features, options, cross_kv=window.cross_kv
                    )
                    store.record_decode(window, result)
                    if rnd:
                        row = window.costs.to_dict()
                        row.update(model=name, round=rnd, window=w, log_mel_ms=round(log_mel_ms, 3))
                        rows.append(row)
    finally:
        for proc, _ in workers.values():
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    table = []
    for name in dict.fromkeys(r["model"] for r in rows):
        for carry in ("local", "features", "cross_kv"):
            group = [r for r in rows if r["model"] == name and r["carry"] == carry]
            med = {s: statistics.median(r[s] for r in group) for s in STAGES}
            tokens = statistics.median(r["tokens"] for r in group)
            table.append(
                {
                    "model": name,
                    "carry": carry,
                    **{s: round(v, 1) for s, v in med.items()},
                    "projection_side": group[0]["projection_side"],
                    "bytes_crossing": statistics.median(r["bytes_sent"] + r["bytes_received"] for r in group),
                    "ms_per_token": round(statistics.median(r["ms_per_token"] for r in group), 2),
                    "tokens": tokens,
                    "total_ms": round(sum(med.values()), 1),
                    "samples": len(group),
                }
            )
    return table


def render(table: list[dict]) -> str:
    head = (
        f"{'model':<8} {'carry':<9} {'log-Mel':>8} {'encoder':>8} {'project':>8} {'side':<8} {'seal':>7} "
        f"{'transfer':>9} {'MB':>6} {'open':>7} {'decode':>8} {'ms/tok':>7} {'total':>8}"
    )
    lines = [head]
    for r in table:
        lines.append(
            f"{r['model']:<8} {r['carry']:<9} {r['log_mel_ms']:>8.1f} {r['encoder_ms']:>8.1f} "
            f"{r['projection_ms']:>8.1f} {r['projection_side']:<8} {r['seal_ms']:>7.1f} "
            f"{r['transfer_ms']:>9.1f} "
            f"{r['bytes_crossing'] / 1e6:>6.2f} {r['open_ms']:>7.1f} {r['decode_ms']:>8.1f} "
            f"{r['ms_per_token']:>7.2f} {r['total_ms']:>8.1f}"
        )
    return "\n".join(lines)


def decision(table: list[dict]) -> str:
    """Which side should project Cross-KV, from the stages that differ between the two carry modes.

    Log-Mel, encoder and decoding are the same work in both modes (their spread here is noise); what
    differs is the projection (same FLOPs, other side) and sealing + transfer + opening, which scale with
    the bytes. A real link adds its own time per byte: shown for 1 Gbit/s.
    """
    out = []
    for name in dict.fromkeys(r["model"] for r in table):
        by = {r["carry"]: r for r in table if r["model"] == name}
        f, c = by["features"], by["cross_kv"]
        crossing = {k: r["seal_ms"] + r["transfer_ms"] + r["open_ms"] for k, r in by.items() if k != "local"}
        differing = {k: crossing[k] + by[k]["projection_ms"] for k in crossing}
        link = {k: by[k]["bytes_crossing"] * 8 / 1e9 * 1000 for k in crossing}  # ms at 1 Gbit/s
        side = (
            "decoder (carry features)"
            if differing["features"] <= differing["cross_kv"]
            else "worker (cross_kv)"
        )
        mb = {k: by[k]["bytes_crossing"] / 1e6 for k in crossing}
        out.append(
            f"{name}: features {mb['features']:.1f} MB, seal+transfer+open {crossing['features']:.0f} ms "
            f"+ projection {f['projection_ms']:.0f} ms = {differing['features']:.0f} ms "
            f"(+{link['features']:.0f} ms at 1 Gbit/s); cross_kv {mb['cross_kv']:.1f} MB, "
            f"{crossing['cross_kv']:.0f} ms + {c['projection_ms']:.0f} ms = {differing['cross_kv']:.0f} ms "
            f"(+{link['cross_kv']:.0f} ms at 1 Gbit/s) -> project Cross-KV on the {side}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--audio", default=str(DEFAULT_AUDIO), help="speech file; its first windows are used")
    parser.add_argument("--windows", type=int, default=2, help="30 s windows per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print every window's costs as JSON too")
    args = parser.parse_args()

    from whisperkv import __version__
    from whisperkv.audio import load_audio

    audio = load_audio(args.audio)
    secret = os.urandom(32)
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = os.path.join(tmp, "secret")
        with open(secret_file, "wb") as f:
            f.write(secret)
        os.chmod(secret_file, 0o600)  # the worker refuses a secret file others can read
        rows = []
        for name in args.models:
            rows += measure_model(name, audio, args.windows, args.rounds, secret, secret_file)
            print(render(summarize([r for r in rows if r["model"] == name])), file=sys.stderr, flush=True)
    table = summarize(rows)
    print(
        f"# CPU: {cpu_model()} ({os.cpu_count()} logical cores), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), whisperkv {__version__}, Python {platform.python_version()}"
    )
    print(f"# load average at the end: {os.getloadavg()[0]:.1f} (the machine is shared: figures are noisy)")
    print(
        f"# audio: {Path(args.audio).name}, first {args.windows} windows, medians over {args.rounds} "
        "interleaved rounds (a warm-up round not counted); decode: greedy; times in ms per window"
    )
    print(render(table))
    print(decision(table))
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
