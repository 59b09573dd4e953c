"""Peak memory per audio length, sequential and ``--batched``: one row per length and mode (issue 44).

    .venv/bin/python benchmarks/batched_memory.py                       # 1.5, 5.5, 20, 40 min; float32
    .venv/bin/python benchmarks/batched_memory.py --minutes 1.5,20 --modes batched

Each run is its own process (``memory.py``'s worker: one model load, one greedy transcription; the files
built at run time in a temp dir from the long-form recordings). The claim it checks: the batched peak is
set by how many windows a batch holds (each its own Cross-KV, Self-KV and encoder output), not by the
length: once every batch is full (batch size 8; the queue splits 9 windows as 5 + 4, so about 20 min of
speech) it is flat, as the sequential one is from the start.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import build_file, describe_machine, run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", default="1.5,5.5,20,40", help="comma-separated lengths")
    parser.add_argument("--modes", default="sequential,batched", help="comma-separated")
    parser.add_argument("--compute_type", default="float32", choices=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.reader_only = False
    describe_machine()
    print(f"tiny.en {args.compute_type} greedy, {args.threads} threads; peak = VmHWM of the run's process")
    print(f"{'mode':<11}{'audio min':>10}{'peak MB':>9}{'after load MB':>15}{'wall s':>8}{'words':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for minutes in (float(m) for m in args.minutes.split(",")):
            file = build_file(Path(tmp) / f"{minutes:g}min.flac", minutes)
            for mode in args.modes.split(","):
                r = run(file, mode, args)
                print(
                    f"{mode:<11}{minutes:>10g}{r['peak_mb']:>9.0f}{r['after_load_mb']:>15.0f}"
                    f"{r['seconds']:>8.0f}{r['words']:>7}",
                    flush=True,
                )
            file.unlink()


if __name__ == "__main__":
    main()
