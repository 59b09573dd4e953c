"""Serving benchmark: `whisperkv serve` under 1, 4, 16 and 32 concurrent clients, against the same server
with --max_batch 1 and against faster-whisper int8 behind a thread pool, all over HTTP on 127.0.0.1.

    .venv/bin/python benchmarks/serve.py                          # everything (long: tens of minutes)
    .venv/bin/python benchmarks/serve.py --clients 16 --short 12 --no-long --leak-requests 200   # quick

Each configuration runs as its own server process (model loaded once, load time excluded; with --warmup N,
N untimed rounds of one request per client first, for both engines alike). At each level,
N client threads take requests from one shared list (the English clips of ../shared/data/speech, then the
two long-form files) until it is empty, each posting the file's bytes as multipart and reading the JSON
answer. Reported per level: audio seconds transcribed per wall second, p50/p95 request latency, and the
server's peak RSS (VmHWM) so far. Default decoding everywhere: greedy with the temperature fallback
schedule (faster-whisper is given beam_size=1 to match). faster-whisper runs `num_workers = min(clients,
pool)` concurrent transcriptions with `cpu_threads = cores // num_workers` (restarted per level, its best
setting), behind a ThreadPoolExecutor of `pool` (= --max_batch) threads. Finally the RSS check: RSS after
--leak-requests short requests against RSS after the first 50 (goal: within 50 MB), both taken with no
request in flight (and every 100 requests between them).

Each whisperkv level also prints its encoder-bound ceiling (``serve_ceiling.py``): the audio seconds per
second were every decoder step free, from the encoder's time per window measured in the same run, and the
fraction of it reached (issue 46: >= 0.9 at 16 clients on short clips). ``--repo DIR`` runs the servers
and the probe from another checkout (a worktree of an older commit) with this script, so two commits are
compared by the same benchmark.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_ceiling import CEILING_GOAL, Ceiling, ceiling, probe, read_encoder_count  # noqa: E402
from serve_process import free_port, rss_mb, server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
LEVELS = (1, 4, 16, 32)
POOL = 16
RSS_GOAL_MB = 50
#: seconds the RSS check waits after each phase: past ``Scheduler.idle_trim_s`` (2 s), when an idle server
#: has given its heap's free memory back (``heap.give_back_free_memory``)
IDLE_WAIT_S = 3.0


@dataclass(frozen=True)
class Clip:
    name: str
    data: bytes
    seconds: float
    path: Path


@dataclass
class LevelResult:
    config: str
    clients: int
    requests: int
    audio_s: float
    wall_s: float
    latencies: list[float]
    peak_rss_mb: float
    failures: int
    ceiling: Ceiling | None = None

    @property
    def throughput(self) -> float:
        return self.audio_s / self.wall_s

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# ------------------------------------------------------------------------------------------ workload


def load_requests(short: int | None, long: bool) -> list[Clip]:
    with open(SPEECH / "manifest.tsv", encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["language"] == "en"]
    rows = [r for r in rows if float(r["duration_s"]) <= 30][: short or None]
    requests = [
        Clip(r["id"], (SPEECH / r["file"]).read_bytes(), float(r["duration_s"]), SPEECH / r["file"])
        for r in rows
    ]
    if long:
        from whisperkv.audio import SAMPLE_RATE, load_audio

        for path in sorted((SPEECH / "long").glob("*")):
            requests.append(Clip(path.name, path.read_bytes(), len(load_audio(path)) / SAMPLE_RATE, path))
    return requests


# ------------------------------------------------------------------------------------------ servers


def whisperkv_command(port: int, compute_type: str, max_batch: int) -> list[str]:
    return [
        sys.executable, "-m", "whisperkv", "serve", "--port", str(port), "--compute_type", compute_type,
        "--max_batch", str(max_batch), "--max_queue", "4096", "--max_upload_mb", "64",
    ]  # fmt: skip


def faster_whisper_command(port: int, workers: int, threads: int) -> list[str]:
    return [
        sys.executable, str(Path(__file__).resolve().parent / "serve_faster_whisper.py"), "--port", str(port),
        "--workers", str(workers), "--threads", str(threads), "--pool", str(POOL),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ clients


def post(client, request: Clip) -> float:
    started = time.perf_counter()
    response = client.post(
        "/v1/audio/transcriptions",
        files={"file": (request.name, request.data, "application/octet-stream")},
        data={"model": "whisper-1"},
    )
    response.raise_for_status()
    response.json()
    return time.perf_counter() - started


def run_level(config: str, port: int, pid: int, clients: int, requests: list[Clip]) -> LevelResult:
    """N client threads drain one shared request list (closed loop); time from first send to last answer."""
    import httpx

    queue = list(reversed(requests))
    lock = threading.Lock()
    latencies: list[float] = []
    failures = 0
    first_error: list[str] = []

    def client_loop() -> None:
        nonlocal failures
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1800) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    request = queue.pop()
                try:
                    latency = post(client, request)
                except httpx.HTTPError as err:
                    with lock:
                        failures += 1
                        first_error.append(repr(err))
                    continue
                with lock:
                    latencies.append(latency)

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if first_error:
        print(f"  {config}: {failures} failed, first: {first_error[0]}")
    audio = sum(r.seconds for r in requests)
    return LevelResult(config, clients, len(requests), audio, wall, latencies, rss_mb(pid, "VmHWM"), failures)


def rss_growth(requests: list[Clip], total: int, clients: int, phase: int = 100) -> list[tuple[int, float]]:
    """(requests answered, RSS in MB) of a fresh float32 server, sampled when nothing is in flight: after
    the first 50 requests, then after every ``phase`` more until ``total``.

    Why between phases: a sample taken while requests run counts their caches and activations, which
    move by over 80 MB with how many of the 16 are in flight and how long their clips are (round 22, scratch,
    sampled every 100 answers: 1,192-1,274 MB, no trend); between phases, once the idle server has given
    its heap back, only what outlives a request is left, so a leak shows as a steady rise and noise does
    not."""
    import httpx

    port = free_port()
    samples: list[tuple[int, float]] = []
    with server(whisperkv_command(port, "default", POOL), port, REPO) as process:
        done = 0
        while done < total:
            count = min(50 if done == 0 else phase, total - done)
            batch = [requests[(done + i) % len(requests)] for i in range(count)]

            def client_loop(offset: int, batch: list[Clip] = batch) -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
                    for clip in batch[offset::clients]:
                        post(client, clip)

            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(client_loop, range(clients)))
            done += count
            time.sleep(IDLE_WAIT_S)  # the server's scheduler gives its heap back after 2 s idle
            samples.append((done, rss_mb(process.pid, "VmRSS")))
    return samples


# ------------------------------------------------------------------------------------------ report


def machine_report(repo: Path = REPO) -> str:
    import ctranslate2
    import fastapi
    import faster_whisper
    import torch
    import uvicorn

    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    imported = subprocess.run(
        [sys.executable, "-c", "import whisperkv; print(whisperkv.__file__)"],
        env={**os.environ, "PYTHONPATH": str(repo)},
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (
        f"whisperkv servers import {imported}\n"
        f"CPU: {cpu}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} (shared, noisy machine)\n"
        f"Python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"whisperkv {commit.stdout.strip()}{' (uncommitted changes)' if dirty else ''} from {repo}, "
        f"benchmark script {Path(__file__).resolve()}\nfaster-whisper {faster_whisper.__version__}, "
        f"ctranslate2 {ctranslate2.__version__}, fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}"
    )


def print_table(results: list[LevelResult]) -> None:
    print(f"{'config':<28}{'clients':>8}{'reqs':>6}{'audio s':>9}{'wall s':>8}{'audio s/s':>11}"
          f"{'p50 s':>8}{'p95 s':>8}{'peak RSS MB':>13}{'failed':>8}{'ceiling':>9}{'of it':>7}")  # fmt: skip
    for r in results:
        top = r.ceiling.audio_per_s if r.ceiling else None
        bound = f"{top:>9.2f}{r.ceiling.fraction:>7.2f}" if top else f"{'-':>9}{'-':>7}"
        print(
            f"{r.config:<28}{r.clients:>8}{r.requests:>6}{r.audio_s:>9.1f}{r.wall_s:>8.1f}{r.throughput:>11.2f}"
            f"{r.percentile(0.5):>8.2f}{r.percentile(0.95):>8.2f}{r.peak_rss_mb:>13.0f}{r.failures:>8}{bound}"
        )


def print_goals(results: list[LevelResult], clients: int, requests: list[Clip]) -> None:
    at = {r.config: r for r in results if r.clients == clients}
    fp32, int8 = at.get("whisperkv float32"), at.get("whisperkv int8")
    batch1, fw = at.get("whisperkv float32 max_batch 1"), at.get("faster-whisper int8 pool")

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"\nGoals at {clients} clients:")
    for ours in (fp32, int8):
        if ours and ours.ceiling and ours.ceiling.fraction is not None:
            fraction, short = ours.ceiling.fraction, all(c.seconds <= 30 for c in requests)
            goal = verdict(fraction >= CEILING_GOAL) if short else "judged on short clips only (--no-long)"
            reached = f"{fraction:.2f} of its encoder-bound ceiling"
            print(f"  {ours.config}: {reached} (goal >= {CEILING_GOAL}): {goal}")
    if fp32 and batch1:
        ratio = fp32.throughput / batch1.throughput
        print(f"  throughput float32 / --max_batch 1 = {ratio:.2f}x (goal >= 3x): {verdict(ratio >= 3)}")
    for name, ours in (("int8", int8), ("float32", fp32)):
        if ours and fw:
            ratio = ours.throughput / fw.throughput
            p95, fw95 = ours.percentile(0.95), fw.percentile(0.95)
            ok_ratio, ok_p95 = verdict(ratio >= 2), verdict(p95 <= fw95)
            print(f"  throughput {name} / faster-whisper int8 = {ratio:.2f}x (goal >= 2x): {ok_ratio}")
            print(f"  p95 {name} {p95:.2f} s vs faster-whisper {fw95:.2f} s (goal: no worse): {ok_p95}")


def run_config(
    name: str, command, probe_type: str | None, clients: int, requests: list[Clip], args: argparse.Namespace
) -> LevelResult:
    """One server for one level: the encoder probe first (whisperkv), then the warm-up and the timed level,
    the server's encoder counters read around the timed part."""
    repo = args.repo.resolve() if probe_type else REPO
    probe_ms = probe(repo, probe_type, [r.path for r in requests]) if probe_type else None
    port = free_port()
    with server(command(port, clients), port, repo) as process:
        for _ in range(args.warmup):  # untimed: every client posts one request, as the level will
            run_level(name, port, process.pid, clients, requests[:clients])
        before = read_encoder_count(port) if probe_type else None
        result = run_level(name, port, process.pid, clients, requests)
        if probe_type:
            count = read_encoder_count(port).since(before)
            seconds = [r.seconds for r in requests]
            result.ceiling = ceiling(probe_ms, count, seconds, result.audio_s, result.wall_s)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--short", type=int, default=None, help="use only the first N short clips")
    parser.add_argument("--no-long", dest="long", action="store_false", help="leave out the long-form files")
    parser.add_argument("--configs", nargs="+", default=["fp32", "int8", "batch1", "fw"])
    parser.add_argument("--leak-requests", type=int, default=1000, help="0 skips the RSS check")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed rounds before each level (each client posts one request): a server's steady state, "
        "not its first requests' one-off costs (0, the default, is how rounds up to 18 measured)",
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=REPO,
        help="the checkout whose whisperkv the servers and the encoder probe run (default: this one)",
    )
    args = parser.parse_args()

    print(machine_report(args.repo.resolve()))
    requests = load_requests(args.short, args.long)
    short_requests = [r for r in requests if r.seconds <= 30]
    warm = f"after {args.warmup} untimed round(s) per server and level" if args.warmup else "cold servers"
    audio = sum(r.seconds for r in requests)
    print(f"workload per level: {len(requests)} requests, {audio:.1f} s of audio; {warm}\n")
    cores = os.cpu_count() or 1
    plans = {  # name, server command, the compute type of its encoder probe (None: no probe)
        "fp32": ("whisperkv float32", lambda port, n: whisperkv_command(port, "default", POOL), "default"),
        "int8": ("whisperkv int8", lambda port, n: whisperkv_command(port, "int8", POOL), "int8"),
        "batch1": (
            "whisperkv float32 max_batch 1",
            lambda port, n: whisperkv_command(port, "default", 1),
            "default",
        ),
        "fw": (
            "faster-whisper int8 pool",
            lambda port, n: faster_whisper_command(port, min(n, POOL), max(1, cores // min(n, POOL))),
            None,
        ),
    }
    results: list[LevelResult] = []
    # levels outermost, configurations interleaved inside: each comparison sees a similar machine state
    for clients in args.clients:
        for key in args.configs:
            name, command, probe_type = plans[key]
            result = run_config(name, command, probe_type, clients, requests, args)
            results.append(result)
            print_table([result])
            if result.ceiling is not None:
                print(f"  {result.ceiling.describe()}")
            sys.stdout.flush()
    print("\nAll levels:")
    print_table(results)
    if 16 in args.clients:
        print_goals(results, 16, requests)
    if args.leak_requests:
        total = max(args.leak_requests, 51)
        samples = rss_growth(short_requests, total, clients=POOL)
        (_, after50), (_, after_all) = samples[0], samples[-1]
        growth = after_all - after50
        verdict = "met" if growth <= RSS_GOAL_MB else "NOT met"
        trail = ", ".join(f"{n} {mb:.0f}" for n, mb in samples)
        print(
            f"\nRSS (whisperkv float32, {POOL} clients, short clips; MB with no request in flight, after "
            f"n requests: {trail}): after 50 requests {after50:.0f} MB, after {total} {after_all:.0f} MB, "
            f"growth {growth:+.0f} MB (goal <= {RSS_GOAL_MB} MB): {verdict}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
