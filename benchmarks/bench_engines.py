"""The engines ``bench.py`` times, each run inside a worker process of its own.

whisperkv (and, with ``--before``, the same engines from an older checkout; ``-nokernels``: float32
where no C compiler works), faster-whisper (sequential and its ``BatchedInferencePipeline``),
whisper.cpp (pywhispercpp), OpenVINO GenAI and openai-whisper, all on the same weights
(``bench_inputs.model_files``, ``openvino_files``). ``worker`` loads one, warms it up, then transcribes
what it is sent.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import numpy as np

BATCH_SIZE = 8  # batched engines, ours and faster-whisper's, decode this many chunks at once


class Engine:
    name = ""

    def transcribe(self, audio: np.ndarray, beam_size: int | None) -> dict:
        """{"text", "tokens" (output tokens or None), "windows" (30 s windows decoded or None), ...}."""
        raise NotImplementedError


class WhisperKV(Engine):
    """whisperkv as a user runs it: ``load_model`` with a compute type, sequential or batched.

    The whisperkv imported is the one on ``sys.path``: ``worker`` puts an older checkout first for a
    ``spec@before`` engine (``bench.py --before``), so this class uses only what every version has."""

    def __init__(self, model: str, compute_type: str, batched: bool = False, vad: str = "energy") -> None:
        import whisperkv

        self.model = whisperkv.load_model(model, compute_type=compute_type)
        plan = self.model.weights_digest.partition("+attention(")[2].rstrip(")")  # what runs its steps
        mode = f" batched {vad}" if batched else ""
        self.name = f"whisperkv {compute_type}{mode} [{plan or 'sdpa'}]"
        self.batched, self.vad = batched, vad
        self._steps = [0, 0.0]  # decoder steps (one new token for every row of a window) and their seconds
        #: inside a timed call: a call nested in it (the vocabulary inside a step) is not counted again
        self._inside = [False]
        forward, forward_rows = self.model.decoder.forward, self.model.decoder.forward_rows
        timed = self._timed

        def timed_forward(tokens, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            # a step of the batched mode's loop; a prompt is not a step (nor is its vocabulary row)
            step = True if tokens.shape[-1] == 1 else None
            return timed(forward, step)(tokens, *args, **kwargs)

        self.model.decoder.forward = timed_forward
        self.model.decoder.forward_rows = timed(forward_rows, True)  # the engine's step
        # the engine's step goes on after forward_rows: the token choice (and, in checkouts whose
        # forward_rows returned rows, the vocabulary), timed as part of it
        self._time_engine_vocabulary()

    def _timed(self, call, step: bool | None = False):  # noqa: ANN001, ANN202
        """``call`` timed: a step (``step`` True: one more, and its seconds), a part of one (False: its
        seconds), or neither (None: not a step's time). A call nested in a timed one is not timed
        again: the vocabulary inside ``forward_rows`` counts once, inside a prompt's not at all."""
        steps, inside = self._steps, self._inside

        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if inside[0]:
                return call(*args, **kwargs)
            inside[0] = True
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                inside[0] = False
                if step is not None:
                    steps[0] += int(step)
                    steps[1] += time.perf_counter() - start

        return run

    def _time_engine_vocabulary(self) -> None:
        from whisperkv.decoding.window import WindowDecode

        timed = self._timed

        class TimedWindow(WindowDecode):
            def advance(self, logits):  # noqa: ANN001, ANN202
                timed(super().advance)(logits)

        self.model.decoder.project = timed(self.model.decoder.project)  # the rows' logits
        import whisperkv.engine.scheduler as scheduler

        scheduler.WindowDecode = TimedWindow  # this benchmark process only

    def transcribe(self, audio, beam_size):
        self._steps[:] = [0, 0.0]
        if self.batched:
            from whisperkv.batched import transcribe_batched

            result = transcribe_batched(
                self.model, audio, beam_size=beam_size, batch_size=BATCH_SIZE, vad=self.vad, language="en"
            )
            windows = result["batched"]["windows"] + result["batched"]["fallbacks"]
        else:
            # the language is given, as to every peer: a multilingual model would otherwise detect it,
            # which costs a clip shorter than 30 s a second encoder pass (the detection window is the
            # first 30 s of the padded log-Mel, as in openai-whisper, not the clip's own window)
            result = self.model.transcribe(audio, beam_size=beam_size, best_of=5, language="en")
            windows = len({s["seek"] for s in result["segments"]})
        return {
            "text": result["text"],
            "tokens": sum(len(s["tokens"]) for s in result["segments"]),
            "windows": windows,
            "steps": self._steps[0],
            "step_s": self._steps[1],
        }


class FasterWhisper(Engine):
    def __init__(self, model_dir: str, compute_type: str, threads: int, batched: bool = False) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.name = f"faster-whisper {compute_type}" + (" batched" if batched else "")
        self.model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
        self.pipeline = BatchedInferencePipeline(self.model) if batched else None

    def transcribe(self, audio, beam_size):
        if self.pipeline is not None:
            segments, _ = self.pipeline.transcribe(
                audio, language="en", beam_size=beam_size or 1, batch_size=BATCH_SIZE
            )
        else:
            segments, _ = self.model.transcribe(audio, language="en", beam_size=beam_size or 1, best_of=5)
        segments = list(segments)
        return {
            "text": "".join(s.text for s in segments),
            "tokens": sum(len(s.tokens) for s in segments),
            "windows": len({s.seek for s in segments}) if self.pipeline is None else None,
        }


class WhisperCpp(Engine):
    """whisper.cpp through pywhispercpp, on a float16 ggml file written from the same .pt."""

    def __init__(self, ggml_path: str, threads: int) -> None:
        self.name = "whisper.cpp f16"
        self.models: dict = {}
        self.path, self.threads = ggml_path, threads
        self.model_for(None)

    def model_for(self, beam_size):
        from pywhispercpp.model import Model

        key = beam_size or 1
        if key not in self.models:  # one context per strategy: greedy, and beam search when asked
            params = dict(n_threads=self.threads, print_progress=False, print_realtime=False, language="en")
            if key > 1:
                params.update(params_sampling_strategy=1, beam_search={"beam_size": key, "patience": -1.0})
            self.models[key] = Model(self.path, redirect_whispercpp_logs_to=None, **params)
        return self.models[key]

    def transcribe(self, audio, beam_size):
        segments = self.model_for(beam_size).transcribe(audio)
        return {"text": "".join(s.text for s in segments), "tokens": None, "windows": None}


class OpenVINO(Engine):
    """OpenVINO GenAI's ``WhisperPipeline`` (Intel's engine) on an export of the same weights
    (``openvino_export.py``): ``default`` (float32 weights, the CPU plugin's default inference precision:
    bfloat16 where the CPU has AVX512-BF16 or AMX) or ``int8`` weights. Timestamps on, as whisperkv's
    long-form transcription has them: a long file is cut where its windows' last timestamps say."""

    def __init__(self, model_dir: str, kind: str, threads: int) -> None:
        import openvino as ov
        import openvino_genai

        self.pipeline = openvino_genai.WhisperPipeline(model_dir, "CPU", INFERENCE_NUM_THREADS=threads)
        precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
        version = openvino_genai.__version__.split("-")[0]
        self.name = f"OpenVINO GenAI {version} {kind} (CPU plugin's precision {precision})"

    def transcribe(self, audio, beam_size):
        config = self.pipeline.get_generation_config()
        config.num_beams, config.return_timestamps = beam_size or 1, True
        if config.is_multilingual:
            config.language, config.task = "<|en|>", "transcribe"
        result = self.pipeline.generate(audio.tolist(), config)
        return {
            "text": "".join(result.texts),
            "tokens": result.perf_metrics.get_num_generated_tokens(),
            "windows": None,
        }


class OpenAIWhisper(Engine):
    def __init__(self, pt_path: str) -> None:
        import whisper

        self.name = "openai-whisper fp32"
        self.model = whisper.load_model(pt_path, device="cpu")

    def transcribe(self, audio, beam_size):
        result = self.model.transcribe(audio, beam_size=beam_size, best_of=5, fp16=False, language="en")
        return {
            "text": result["text"],
            "tokens": sum(len(s["tokens"]) for s in result["segments"]),
            "windows": len({s["seek"] for s in result["segments"]}),
        }


#: the engines a user chooses between: whisperkv's compute types (float32, int8, bfloat16: ``bf16``),
#: sequential and batched (its VADs),
#: and each peer's. A fast path's slow twin is proven equal by the tests, not timed here; the twins the
#: benchmark once carried and what they measured are in docs/performance_history.md.
ENGINES = (
    "whisperkv-fp32",
    "whisperkv-int8",
    "whisperkv-bf16",
    "whisperkv-batched-int8",
    "whisperkv-batched-fp32",
    "whisperkv-batched-int8-silero",
    "whisperkv-fp32-nokernels",
    "faster-whisper-fp32",
    "faster-whisper-int8",
    "faster-whisper-batched-int8",
    "faster-whisper-batched-fp32",
    "whisper.cpp-f16",
    "openai-whisper-fp32",
    "openvino-default",
    "openvino-int8",
)
BEFORE = "@before"  # a whisperkv engine's suffix: the same engine from the checkout ``--before`` names


def _make_engine(spec: str, threads: int, paths: dict) -> Engine:
    if spec.startswith("whisperkv-"):
        compute = "int8" if "int8" in spec else "bfloat16" if "bf16" in spec else "float32"
        vad = "silero" if "silero" in spec else "energy"
        return WhisperKV(paths["model"], compute, "batched" in spec, vad)
    if spec.startswith("faster-whisper-"):
        compute = "int8" if spec.endswith("int8") else "float32"
        return FasterWhisper(paths["ct2_dir"], compute, threads, batched="batched" in spec)
    if spec == "whisper.cpp-f16":
        return WhisperCpp(paths["ggml"], threads)
    if spec.startswith("openvino-"):
        kind = spec.removeprefix("openvino-")
        return OpenVINO(paths[spec], kind, threads)
    if spec == "openai-whisper-fp32":
        return OpenAIWhisper(paths["pt"])
    raise ValueError(f"unknown engine {spec!r}: one of {', '.join(ENGINES)}")


def _use_checkout(spec: str, paths: dict) -> str:
    """``spec@before``: the whisperkv of the checkout ``paths["before"]`` comes first on ``sys.path``
    (this worker has not imported whisperkv yet); returns the spec without its suffix."""
    if not spec.endswith(BEFORE):
        return spec
    if "whisperkv" in sys.modules or not spec.startswith("whisperkv-") or not paths.get("before"):
        raise ValueError(f"{spec}: a whisperkv engine, with --before naming a checkout, in a fresh worker")
    sys.path.insert(0, paths["before"])
    return spec.removesuffix(BEFORE)


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM, not ``ru_maxrss``, which Linux carries over an exec from the
    process that forked it (here the benchmark's parent, with all the audio: every worker read >= its RSS)."""
    try:
        for line in open("/proc/self/status", encoding="ascii"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(spec: str, threads: int, paths: dict, audios: dict, conn) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "-nokernels" in spec:  # a compiler that fails: the C kernels are not built, PyTorch's paths run
        os.environ["CC"] = "false"
    try:
        import torch

        torch.set_num_threads(threads)
        engine = _make_engine(_use_checkout(spec, paths), threads, paths)
        if spec.endswith(BEFORE):
            engine.name += " before"
        if "-nokernels" in spec:
            engine.name += " (CC=false: no C kernels)"
        engine.transcribe(audios["warmup"], None)  # first call pays one-off costs
    except Exception as exc:  # noqa: BLE001 - an unavailable peer is reported, not fatal
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", engine.name))
    while True:
        job = conn.recv()
        if job is None:
            break
        name, beam = job
        start = time.perf_counter()
        run = engine.transcribe(audios[name], beam)
        elapsed = time.perf_counter() - start
        rss = peak_rss_bytes()
        conn.send(("done", elapsed, run, rss))
