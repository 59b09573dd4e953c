"""int8 kernels for a decoder step: fbgemm's dynamic quantisation, the rows kernel, weight-only int8.

    PYTHONPATH=. .venv/bin/python benchmarks/int8_kernels.py [--threads 2] [--rows 1,5,40] [--repeats 15]
        [--shapes "MLP up,Cross-KV key"] [--against COMMIT [--transcribe short,utterances]]

For each decoder-shaped product of tiny.en (fused query/key/value, MLP up and down, the vocabulary
projection, a Cross-KV key or value: 1,500 rows a window) on ``--rows`` rows (1: greedy, 5: a beam-5
window, 40: batched beam 5): ``Int8Linear``
through fbgemm (``quantized::linear_dynamic``: int8 weights with per-row scales, one activation scale
per call), through the C rows kernel (``cpu/int8_rows.py``: the same int8 weights, one scale per
row), and ``aten._weight_int8pack_mm`` (activations kept in bfloat16). Each is timed warm (the same
weights again) and cold (64 MB of other data written between calls, as a real step's other reads do),
interleaved, medians in microseconds; each one's largest error against the float32 product beside.
``--against COMMIT``: also the rows kernel built from that commit's ``kernels/int8_rows.c`` (same
flags), and whether its products equal the current kernel's bit for bit; with ``--transcribe``, two
tiny.en int8 models (one given that kernel) transcribe the benchmark's audio (``bench.build_audio``)
greedy and beam 5, interleaved, medians of ``--repeats``, and whether their texts are the same.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

SHAPES = {
    "query|key|value": (1152, 384),
    "MLP up": (1536, 384),
    "MLP down": (384, 1536),
    "vocabulary": (51864, 384),
    "Cross-KV key": (384, 384),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1", help="comma list of row counts")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of the products to time")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--against", help="a commit whose int8 rows kernel to time beside the current one")
    p.add_argument("--transcribe", help="with --against: whole transcriptions of these bench.py audios")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from whisperkv.cpu.int8_linear import Int8Linear
    from whisperkv.cpu.int8_rows import load_rows_kernel

    print(describe(args.threads))
    kernel = load_rows_kernel()
    print("rows kernel:", "not built (no C compiler)" if kernel is None else "built")
    ways = ["fbgemm", "rows kernel", "int8pack"] if kernel is not None else ["fbgemm", "int8pack"]
    other = _kernel_at(args.against) if args.against and kernel is not None else None
    if other is not None:
        ways.insert(2, f"at {args.against}")
    header = f"{'product':<16}{'out x in':>11}{'rows':>5}"
    header += "".join(f"{w + ' ' + c:>18}" for c in ("warm", "cold") for w in ways)
    print(f"\n{header}  max |error| " + ", ".join(ways))
    gen = torch.Generator().manual_seed(0)
    flush = torch.empty(16 * 1024 * 1024)
    for name in args.shapes.split(","):
        out, width = SHAPES[name]
        weight = torch.randn(out, width, generator=gen) * 0.05
        # a bias, as most of the model's layers have: the rows kernel adds it in its float epilogue, whose
        # last bits follow how the compiler arranged the code (-ffast-math), so --against checks them too
        bias = torch.randn(out, generator=gen) * 0.05
        layers = {"fbgemm": [Int8Linear(weight, bias) for _ in range(3)]}
        if kernel is not None:
            layers["rows kernel"] = [Int8Linear(weight, bias, kernel) for _ in range(3)]
        if other is not None:  # the same packed layout: only the kernel differs
            layers[f"at {args.against}"] = [Int8Linear(weight, bias, other) for _ in range(3)]
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        packs = [(qweight.clone(), scales.to(torch.bfloat16)) for _ in range(3)]
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, width, generator=gen)

            def call(
                way: str,
                i: int,
                x: torch.Tensor = x,
                layers: dict = layers,
                packs: list = packs,
                bias: torch.Tensor = bias,
            ) -> torch.Tensor:
                if way == "int8pack":
                    q, s = packs[i]
                    return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), q, s).float() + bias
                return layers[way][i](x)

            reference = x @ weight.T + bias
            errors = [float((call(w, 0) - reference).abs().max()) for w in ways]
            if other is not None:
                same = torch.equal(call("rows kernel", 0), call(f"at {args.against}", 0))
                errors.append(f"bits {'equal' if same else 'DIFFER'} at {args.against}")  # type: ignore[arg-type]
            times: dict[tuple[str, bool], list[float]] = {(w, c): [] for w in ways for c in (False, True)}
            for n in range(args.repeats):
                for cold in (False, True):
                    for way in ways:
                        if cold:
                            flush.add_(1.0)
                        else:  # warm: the same weights and input just read
                            call(way, n % 3)
                        start = time.perf_counter()
                        call(way, n % 3)
                        times[(way, cold)].append(time.perf_counter() - start)
            row = "".join(
                f"{statistics.median(times[(w, c)]) * 1e6:>16.0f}us" for c in (False, True) for w in ways
            )
            shown = ", ".join(e if isinstance(e, str) else f"{e:.4f}" for e in errors)
            print(f"{name:<16}{f'{out}x{width}':>11}{rows:>5}{row}  {shown}")
    if other is not None and args.transcribe:
        _transcriptions(other, args.against, args.transcribe.split(","), args.repeats)
    return 0


def _transcriptions(other, commit: str, audio_names: list[str], repeats: int) -> None:  # noqa: ANN001
    """tiny.en int8 with the current rows kernel and with ``other``, transcriptions interleaved."""
    from bench import build_audio

    import whisperkv
    from whisperkv.cpu.int8_linear import Int8Linear

    audios, _ = build_audio(min_utterance_seconds=120)
    models = {"now": whisperkv.load_model("tiny.en", compute_type="int8")}
    models[commit] = whisperkv.load_model("tiny.en", compute_type="int8")
    for layer in models[commit].modules():
        if isinstance(layer, Int8Linear) and layer.kernel is not None:
            layer.kernel = other  # the packed weights are laid out the same for both
    for model in models.values():
        model.transcribe(audios["warmup"], language="en", verbose=None)
    print(f"\ntiny.en int8 transcriptions, medians of {repeats} (interleaved): now against {commit}")
    for name in audio_names:
        for beam in (None, 5):
            times: dict[str, list[float]] = {key: [] for key in models}
            texts: dict[str, str] = {}
            for _ in range(repeats):
                for key, model in models.items():
                    start = time.perf_counter()
                    result = model.transcribe(audios[name], language="en", verbose=None, beam_size=beam)
                    texts[key] = result["text"]
                    times[key].append(time.perf_counter() - start)
            now, then = statistics.median(times["now"]), statistics.median(times[commit])
            mode = "greedy" if beam is None else f"beam{beam}"
            print(
                f"{name:<11}{mode:<7} now {now:6.2f} s  at {commit} {then:6.2f} s  ratio {now / then:.2f}  "
                f"same text: {texts['now'] == texts[commit]}"
            )


def _kernel_at(commit: str):  # noqa: ANN202 - an Int8RowsKernel, or None
    """The rows kernel built from ``commit``'s ``int8_rows.c`` with the library's flags, or None (no
    compiler, or no such file at that commit). With that commit's ``rows_f32.c`` where there is one: the
    int8 step's LayerNorm and GELU come from it (round 15 on)."""
    from whisperkv.cpu.build import compile_library
    from whisperkv.cpu.int8_rows import Int8RowsKernel

    compiler = shutil.which("cc") or shutil.which("gcc")
    root = Path(__file__).resolve().parents[1]

    def show(name: str) -> subprocess.CompletedProcess:
        path = f"{commit}:whisperkv/cpu/kernels/{name}"
        return subprocess.run(["git", "show", path], cwd=root, capture_output=True)

    shown = show("int8_rows.c")
    if compiler is None or shown.returncode:
        print(f"no int8 rows kernel at {commit}: {shown.stderr.decode().strip() or 'no C compiler'}")
        return None
    folder = Path(tempfile.mkdtemp(prefix="int8_rows_"))
    sources = [folder / "int8_rows.c"]
    sources[0].write_bytes(shown.stdout)
    helpers = show("rows_f32.c")
    if helpers.returncode == 0:
        sources.append(folder / "rows_f32.c")
        sources[1].write_bytes(helpers.stdout)
    for name in ("amx.h", "int8_avx2.h"):  # included by int8_rows.c from round 18 and session 54 on
        header = show(name)
        if header.returncode == 0:
            (folder / name).write_bytes(header.stdout)
    built = folder / "int8_rows.so"
    compile_library(compiler, built, sources=tuple(sources))
    library = ctypes.CDLL(str(built))
    shutil.rmtree(folder)  # the loaded library stays mapped
    return Int8RowsKernel(library)


if __name__ == "__main__":
    sys.exit(main())
