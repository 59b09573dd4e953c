"""The engines ``bench.py`` times, each run inside a worker process of its own.

whisperkv (with its twins: one fast path off, named by a suffix), faster-whisper (sequential and its
``BatchedInferencePipeline``), whisper.cpp (pywhispercpp) and openai-whisper, all on the same weights
(``bench_inputs.model_files``). ``worker`` loads one, warms it up, then transcribes what it is sent.
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np

BATCH_SIZE = 8  # batched engines, ours and faster-whisper's, decode this many chunks at once


class Engine:
    name = ""

    def transcribe(self, audio: np.ndarray, beam_size: int | None) -> dict:
        """{"text", "tokens" (output tokens or None), "windows" (30 s windows decoded or None), ...}."""
        raise NotImplementedError


class WhisperKV(Engine):
    def __init__(
        self,
        model: str,
        compute_type: str,
        batched: bool = False,
        vad: str = "energy",
        screen: bool = False,
        sdpa: bool = False,
        hold_end: bool = True,
        gemm: bool = False,
        calls: bool = False,
        head_by_head: bool = False,
        sdpa_encoder: bool = False,
        torch_linears: bool = False,
        torch_choice: bool = False,
        block_steps: bool = False,
    ) -> None:
        import torch

        import whisperkv
        from whisperkv.model.attend_kernel import use_attention_kernels
        from whisperkv.model.vocab import current_layout

        self.model = whisperkv.load_model(model, compute_type=compute_type, vocab_screen=screen)
        if sdpa:  # PyTorch's SDPA everywhere: int8 as before round 6, float32 as before round 9
            use_attention_kernels(self.model, on=False)
        if gemm:  # float32 steps' linears through the row GEMMs (before round 11); int8 steps with
            # PyTorch between the kernels (LayerNorms, GELU, residuals; before round 15)
            use_attention_kernels(self.model, rows=False)
        if head_by_head:  # the int8 type's bfloat16 encoder head by head, as before round 15 with AMX
            use_attention_kernels(self.model, head_by_head=True)
        if sdpa_encoder:  # the int8 type's bfloat16 encoder through SDPA, as before round 18 with AMX
            use_attention_kernels(self.model, tiles=False)
        if torch_linears:  # the int8 type's encoder linears through PyTorch, as in round 18 with AMX
            use_attention_kernels(self.model, linears=False)
        if torch_choice:  # a greedy step's filters and choice through PyTorch, as before round 20 (this
            # worker process only: the fused step asks for its kernel at each window)
            import whisperkv.decoding.greedy_choice as greedy_choice

            greedy_choice._kernel_fn = lambda: None
        if block_steps:  # steps block by block from Python, as before round 21
            self.model.decoder.decoder_step = None
        if calls:  # float32 blocks' steps call by call from Python, as before round 13
            from whisperkv.model.block_step import use_block_step

            use_block_step(self.model.decoder, on=False)
        layout = current_layout(self.model.decoder)
        mlp = self.model.decoder.blocks[0].mlp
        rows_kernel = [m.kernel for m in mlp.modules() if getattr(m, "kernel", None) is not None]
        if rows_kernel:
            layout += " rows kernel" + (" (amx)" if rows_kernel[0].amx else "")
        if self.model.decoder.blocks[0].step_rows is not None:
            layout += ", linears kernel"
        if self.model.decoder.blocks[0].block_step is not None:
            layout += ", block step"
        if self.model.decoder.decoder_step is not None:
            layout += ", whole step"
        if self.model.decoder.attention_kernel is not None:
            layout += ", attn kernel"
        if self.model.decoder.kv_dtype == torch.bfloat16:
            layout += ", bf16 caches"
        encoder_attention = self.model.encoder.blocks[0].attn.kernel
        if encoder_attention is not None:
            tiles = type(encoder_attention).__name__ == "TiledEncoderAttention"
            layout += ", encoder amx tiles" if tiles else ", encoder head by head"
            layout += " + linears" if self.model.encoder.blocks[0].tiles is not None else ""
        self.name = f"whisperkv {compute_type}" + (f" batched {vad}" if batched else "") + f" [{layout}]"
        self.name += " screened" if self.model.decoder.vocab_screen is not None else ""
        self.name += " no hold" if batched and not hold_end else ""
        self.name += " torch choice" if torch_choice else ""
        self.name += " system heap" if os.environ.get("WHISPERKV_HEAP") == "system" else ""
        self.batched, self.vad, self.hold_end = batched, vad, hold_end
        self._steps = [0, 0.0]  # decoder steps (one new token for every row of a window) and their seconds
        forward, forward_rows = self.model.decoder.forward, self.model.decoder.forward_rows

        def timed_forward(tokens, cache, positions=None):  # noqa: ANN001, ANN202 - the decoder's signature
            start = time.perf_counter()
            out = forward(tokens, cache, positions)
            if tokens.shape[-1] == 1:  # a step of the batched mode's loop (the prompt is not a step)
                self._steps[0] += 1
                self._steps[1] += time.perf_counter() - start
            return out

        def timed_forward_rows(groups, project=True):  # noqa: ANN001, ANN202 - the engine's step
            start = time.perf_counter()
            out = forward_rows(groups, project)
            self._steps[0] += 1
            self._steps[1] += time.perf_counter() - start
            return out

        self.model.decoder.forward = timed_forward
        self.model.decoder.forward_rows = timed_forward_rows
        # the engine's step goes on after forward_rows: the vocabulary (every logit, or the int8 screen of
        # greedy rows and their deferred log-probabilities) and the token choice. Timed as part of it.
        self._time_engine_vocabulary()

    def _time_engine_vocabulary(self) -> None:
        from whisperkv.decoding.window import WindowDecode

        steps, inside = self._steps, [False]
        model = self.model

        def timed(call):  # noqa: ANN001, ANN202 - adds a call's seconds once (not again when nested)
            def run(*args):  # noqa: ANN002, ANN202
                if inside[0]:
                    return call(*args)
                inside[0] = True
                start = time.perf_counter()
                try:
                    return call(*args)
                finally:
                    steps[1] += time.perf_counter() - start
                    inside[0] = False

            return run

        class TimedWindow(WindowDecode):
            def advance(self, logits):  # noqa: ANN001, ANN202
                timed(super().advance)(logits)

            def advance_screened(self, *rows):  # noqa: ANN002, ANN202
                timed(super().advance_screened)(*rows)

            def _screened_sums(self):  # noqa: ANN202
                timed(super()._screened_sums)()

        model.decoder.project = timed(model.decoder.project)  # the full rows' logits
        screen = model.decoder.vocab_screen
        if screen is not None:  # greedy rows: the int8 products of the screen
            screen.approximate = timed(screen.approximate)
        import whisperkv.engine.scheduler as scheduler

        scheduler.WindowDecode = TimedWindow  # this benchmark process only

    def transcribe(self, audio, beam_size):
        self._steps[:] = [0, 0.0]
        if self.batched:
            from whisperkv.batched import transcribe_batched

            result = transcribe_batched(
                self.model,
                audio,
                beam_size=beam_size,
                batch_size=BATCH_SIZE,
                vad=self.vad,
                hold_end=self.hold_end,
                language="en",
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


ENGINES = (
    "whisperkv-fp32",
    "whisperkv-fp32-sdpa",
    "whisperkv-fp32-gemm",
    "whisperkv-fp32-screened",
    "whisperkv-fp32-unscreened",
    "whisperkv-fp32-sysheap",
    "whisperkv-fp32-calls",
    "whisperkv-fp32-torchchoice",
    "whisperkv-fp32-blocksteps",
    "whisperkv-int8",
    "whisperkv-int8-sdpa",
    "whisperkv-int8-pytorch",
    "whisperkv-int8-headbyhead",
    "whisperkv-int8-sdpaencoder",
    "whisperkv-int8-torchlinears",
    "whisperkv-int8-torchchoice",
    "whisperkv-int8-blocksteps",
    "whisperkv-batched-int8",
    "whisperkv-batched-int8-sdpa",
    "whisperkv-batched-int8-sdpaencoder",
    "whisperkv-batched-int8-torchlinears",
    "whisperkv-batched-fp32",
    "whisperkv-batched-int8-silero",
    "whisperkv-batched-int8-nohold",
    "faster-whisper-fp32",
    "faster-whisper-int8",
    "faster-whisper-batched-int8",
    "faster-whisper-batched-fp32",
    "whisper.cpp-f16",
    "openai-whisper-fp32",
)


#: engine suffixes naming a default engine with one of its fast paths off (printed as ratios to it)
TWINS = (
    "-sdpa",
    "-gemm",
    "-sysheap",
    "-calls",
    "-pytorch",
    "-headbyhead",
    "-sdpaencoder",
    "-torchlinears",
    "-torchchoice",
    "-blocksteps",
)


def _make_engine(spec: str, threads: int, paths: dict) -> Engine:
    if spec.startswith("whisperkv-"):
        if spec.endswith("-sysheap"):  # glibc's heap defaults: the twin of whisperkv/heap.py's settings
            from whisperkv.heap import OPT_OUT

            os.environ[OPT_OUT] = "system"
        compute = "int8" if "int8" in spec else "float32"
        vad = "silero" if "silero" in spec else "energy"
        return WhisperKV(
            paths["model"],
            compute,
            "batched" in spec,
            vad,
            screen=spec.endswith("-screened"),
            sdpa=spec.endswith("-sdpa"),
            hold_end=not spec.endswith("-nohold"),
            gemm=spec.endswith(("-gemm", "-pytorch")),  # int8: PyTorch between its kernels, before round 15
            calls=spec.endswith("-calls"),
            head_by_head=spec.endswith("-headbyhead"),
            sdpa_encoder=spec.endswith("-sdpaencoder"),
            torch_linears=spec.endswith("-torchlinears"),
            torch_choice=spec.endswith("-torchchoice"),
            block_steps=spec.endswith("-blocksteps"),
        )
    if spec.startswith("faster-whisper-"):
        compute = "int8" if spec.endswith("int8") else "float32"
        return FasterWhisper(paths["ct2_dir"], compute, threads, batched="batched" in spec)
    if spec == "whisper.cpp-f16":
        return WhisperCpp(paths["ggml"], threads)
    if spec == "openai-whisper-fp32":
        return OpenAIWhisper(paths["pt"])
    raise ValueError(f"unknown engine {spec!r}: one of {', '.join(ENGINES)}")


def worker(spec: str, threads: int, paths: dict, audios: dict, conn) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
        engine = _make_engine(spec, threads, paths)
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
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send(("done", elapsed, run, rss))
