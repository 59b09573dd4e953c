"""The float32 decoder step's linears in one C call each (``cpu/step_rows.py``, ``kernels/rows_f32.c``):
right against float64, a row's bits its own whatever rows and threads are beside it, and transcripts
equal to those of its slow twin (the row GEMMs)."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import kernel_variant, torch_threads
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.flags import cpu_has_avx2_fma_f16c
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.step_rows import StepRowsKernel, load_step_rows

#: (out, in) of tiny.en's and base's decoder linears, and widths not a multiple of the 4 outputs a pass
#: computes (base's multilingual vocabulary is 51,865 tokens)
SHAPES = [(1152, 384), (384, 1536), (1536, 512), (67, 32), (3, 16)]


@pytest.fixture(scope="module")
def kernel() -> StepRowsKernel:
    built = load_step_rows()
    if built is None:
        pytest.skip("no C compiler: the step rows kernel is not built")
    return built


def _rows_f32_build(tmp_path_factory, name: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """``kernels/rows_f32.c`` alone, built with ``flags`` into a library of its own, or None without a
    C compiler."""
    return kernel_variant(tmp_path_factory.mktemp(name) / f"rows_{name}.so", flags, "rows_f32.c")


@pytest.fixture(scope="module")
def plain_c_library(tmp_path_factory) -> ctypes.CDLL | None:
    """``kernels/rows_f32.c`` built without AVX-512 (its one-lane-at-a-time loops), or None: built once
    for the module's tests."""
    flags = ("-O3", "-ffast-math", "-fopenmp", "-fPIC", "-mno-avx512f")
    return _rows_f32_build(tmp_path_factory, "plain", flags)


@pytest.fixture(scope="module")
def plain_c_kernel(plain_c_library) -> StepRowsKernel | None:
    return StepRowsKernel(plain_c_library) if plain_c_library is not None else None


@pytest.fixture(scope="module")
def avx2_kernel(tmp_path_factory) -> StepRowsKernel | None:
    """``kernels/rows_f32.c`` built for AVX2 with FMA and F16C but not AVX-512 (its two-half path, the
    one an AMD Zen 3 runs), where this CPU can run it; else None."""
    if not cpu_has_avx2_fma_f16c():
        return None
    flags = ("-O3", "-ffast-math", "-fopenmp", "-fPIC", "-mavx2", "-mfma", "-mf16c", "-mno-avx512f")
    library = _rows_f32_build(tmp_path_factory, "avx2", flags)
    return StepRowsKernel(library) if library is not None else None


def _inputs(out: int, width: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g)
    weight = torch.randn(out, width, generator=g) / width**0.5
    bias = torch.randn(out, generator=g)
    norm = nn.LayerNorm(width)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(width, generator=g))
        norm.bias.copy_(0.1 * torch.randn(width, generator=g))
    residual = torch.randn(n, out, generator=g)
    return x, weight, bias, norm, residual


def _reference(x, weight, bias, norm, gelu, residual):
    """The same linear in float64, through PyTorch's own operations."""
    h = x.double()
    if norm is not None:
        h = F.layer_norm(h, h.shape[-1:], norm.weight.double(), norm.bias.double(), norm.eps)
    y = h @ weight.double().T + (bias.double() if bias is not None else 0)
    if gelu:
        y = F.gelu(y)
    return y + residual.double() if residual is not None else y


def _versions(kernel, plain):
    return [("library", kernel)] + ([("plain C", plain)] if plain is not None else [])


@pytest.mark.parametrize("out, width", SHAPES)
def test_each_epilogue_equals_float64(kernel, plain_c_kernel, out, width):
    """LayerNorm, product, bias, GELU and residual, alone and together, 1-7 rows: within float32's
    rounding of the float64 result, in the library and in a plain-C build."""
    with torch.no_grad():
        for name, version in _versions(kernel, plain_c_kernel):
            for n in (1, 2, 3, 4, 5, 7):
                x, weight, bias, norm, residual = _inputs(out, width, n, seed=n)
                for use_norm, gelu, use_residual, use_bias in [
                    (False, False, False, True),
                    (True, False, False, True),
                    (True, True, False, True),
                    (False, False, True, True),
                    (True, False, True, False),
                ]:
                    how = dict(
                        bias=bias if use_bias else None,
                        norm=norm if use_norm else None,
                        gelu=gelu,
                        residual=residual if use_residual else None,
                    )
                    got = version(x, weight, **how)
                    want = _reference(x, weight, **how)
                    assert got.shape == (n, out) and got.dtype == torch.float32
                    error = (got.double() - want).abs().max().item()
                    assert error < 2e-5, (name, n, use_norm, gelu, use_residual, use_bias, error)


@pytest.mark.parametrize("out, width", SHAPES)
def test_the_avx2_build_gives_the_librarys_bits_and_the_plain_c_builds(
    kernel, avx2_kernel, plain_c_kernel, out, width
):
    """Every vector path sums in one order (16 lanes of fused multiply-adds, one reduction tree): the
    AVX2 build's outputs, float32 or float16 weights, 1-7 rows, are the library's bits (AVX-512 where
    the CPU has it) and the plain-C build's."""
    if avx2_kernel is None or plain_c_kernel is None:
        pytest.skip("this CPU does not run AVX2 with FMA and F16C, or no C compiler")
    with torch.no_grad():
        for n in (1, 2, 5, 7):
            x, weight, bias, norm, residual = _inputs(out, width, n, seed=n)
            for w in (weight, weight.half()):
                for gelu in (False, True):
                    how = dict(bias=bias, norm=norm, gelu=gelu, residual=residual)
                    want = kernel(x, w, **how)
                    assert torch.equal(avx2_kernel(x, w, **how), want), (n, w.dtype, gelu)
                    assert torch.equal(plain_c_kernel(x, w, **how), want), (n, w.dtype, gelu)


def test_a_rows_bits_depend_on_nothing_beside_it(kernel, plain_c_kernel):
    """A row alone, among 2-9 rows at any place, with 1 or 2 threads: the same bits (a request batched
    with others gets what it gets alone, without the chunk-width rule the row GEMMs need)."""
    x, weight, bias, norm, residual = _inputs(1536, 384, 9, seed=3)
    with torch.no_grad(), torch_threads(2):
        for name, version in _versions(kernel, plain_c_kernel):
            alone = torch.cat([version(x[i : i + 1], weight, bias, norm=norm, gelu=True) for i in range(9)])
            for n in range(2, 10):
                batched = version(x[:n], weight, bias, norm=norm, gelu=True)
                assert torch.equal(batched, alone[:n]), (name, n)
            shuffled = torch.randperm(9, generator=torch.Generator().manual_seed(1))
            again = version(x[shuffled], weight, bias, norm=norm, gelu=True)
            assert torch.equal(again, alone[shuffled]), name
            with torch_threads(1):
                one_thread = version(x, weight, bias, norm=norm, gelu=True)
            assert torch.equal(one_thread, alone), name


def test_widths_it_does_not_take_are_refused(kernel):
    """An input width not a multiple of 16, another dtype, a transposed matrix: ``takes`` says no, and
    a call raises instead of writing anything."""
    assert not kernel.takes(torch.zeros(384, 20)) and not kernel.takes(torch.zeros(384, 32).T)
    assert not kernel.takes(torch.zeros(384, 384, dtype=torch.float64))
    assert kernel.takes(torch.zeros(384, 384)) and kernel.takes(torch.zeros(51865, 512))
    with pytest.raises(ValueError, match="does not take a 384 x 20 matrix"):
        kernel(torch.zeros(1, 20), torch.zeros(384, 20), None)


def test_float32_models_step_through_it_and_its_twin_gives_the_same_tokens(kernel_model, speech_dir):
    """The slow twin: the same model with its step's linears through the row GEMMs. One step's logits
    agree to the order of the sums, and greedy and beam 5 transcripts are token for token the same."""
    assert all(block.step_rows is not None for block in kernel_model.decoder.blocks)
    clips = ["en/jfk.flac", "en/lj_LJ001-0002.flac"]
    tokens: dict[bool, list] = {}
    try:
        for rows in (True, False):
            use_attention_kernels(kernel_model, rows=rows)
            assert all((block.step_rows is not None) == rows for block in kernel_model.decoder.blocks)
            tokens[rows] = [
                [
                    s["tokens"]
                    for s in kernel_model.transcribe(str(speech_dir / c), beam_size=beam)["segments"]
                ]
                for c in clips
                for beam in (None, 5)
            ]
    finally:
        use_attention_kernels(kernel_model, rows=True)
    assert tokens[True] == tokens[False]
    assert all(t for t in tokens[True])


def test_one_steps_logits_agree_with_the_row_gemms(kernel_model, speech_dir):
    """Beam-5 and greedy rows of one step, batched together: logits within 1e-4 of the twin's."""
    import whisperkv
    from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

    decoder = kernel_model.decoder
    mel = pad_or_trim(log_mel_spectrogram(whisperkv.load_audio(speech_dir / "en" / "jfk.flac")), N_FRAMES)
    logits = {}
    try:
        with torch.no_grad():
            cross = decoder.project_cross_kv(
                kernel_model.embed_audio(mel[None]), kernel_model.encoder_provenance(mel[None])
            )
            for rows in (True, False):
                use_attention_kernels(kernel_model, rows=rows)
                greedy, beams = decoder.new_cache(cross), decoder.new_cache(cross, batch_size=5)
                decoder(torch.tensor([[50257, 50362, 440]]), greedy)
                decoder(torch.tensor([[50257, 50362, 440]] * 5), beams)
                step = [(torch.tensor([[1002]]), greedy), (torch.tensor([[1002]] * 5), beams)]
                logits[rows] = decoder.forward_rows(step)
    finally:
        use_attention_kernels(kernel_model, rows=True)
    assert logits[True].shape == (6, decoder.token_embedding.weight.shape[0])
    assert (logits[True] - logits[False]).abs().max().item() < 1e-4
    assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))


def test_the_vocabulary_projection_reads_through_it_and_keeps_it_when_relaid(kernel_model):
    """The tied projection of a float32 model is the kernel's too (one row's logits are the row's own
    dot products), and storing the table again (``apply_layout``) keeps it."""
    from whisperkv.cpu.vocab import apply_layout

    decoder = kernel_model.decoder
    projection = decoder.logits_projection
    assert projection.kernel is decoder.blocks[0].step_rows is not None
    hidden = torch.randn(
        3, decoder.token_embedding.weight.shape[1], generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        together = decoder.project(hidden, [1, 1, 1])
        alone = torch.cat([decoder.project(hidden[i : i + 1], [1]) for i in range(3)])
        assert torch.equal(together, alone)
        assert (
            together.double() - hidden.double() @ decoder.token_embedding.weight.double().T
        ).abs().max() < 1e-4
        apply_layout(decoder, "rows-gemm")  # float32 again: the same logits
        assert decoder.logits_projection.kernel is decoder.blocks[0].step_rows
        assert torch.equal(decoder.project(hidden, [1, 1, 1]), together)
        use_attention_kernels(kernel_model, rows=True)


def test_a_float16_valued_table_is_held_in_float16_with_the_same_logits(kernel_model):
    """tiny.en is stored in float16, so its float32 table holds float16 values: the kernel reads a
    float16 copy (half the bytes a step reads, half the memory) and gives the float32 table's bits. A
    table with values a float16 cannot hold stays float32."""
    from whisperkv.cpu.step_rows import half_copy

    decoder = kernel_model.decoder
    table = decoder.token_embedding.weight
    assert table.dtype == torch.float16 and decoder.logits_projection.weight.data_ptr() == table.data_ptr()
    hidden = torch.randn(5, table.shape[1], generator=torch.Generator().manual_seed(4))
    kernel = decoder.blocks[0].step_rows
    with torch.no_grad():
        assert torch.equal(kernel(hidden, table, None), kernel(hidden, table.float(), None))
        assert torch.equal(decoder.project(hidden, [5]), kernel(hidden, table.float(), None))
        tokens = torch.tensor([[50257, 440, 1002]])
        assert decoder._embed(tokens, 0).dtype == torch.float32
    assert half_copy(table.float()) is not None
    off = table.float().clone()
    off[7, 3] += 1e-7  # not a float16 any more
    assert half_copy(off) is None
    try:
        use_attention_kernels(kernel_model, rows=False)  # the row GEMMs read float32
        assert decoder.token_embedding.weight.dtype == torch.float32
        assert torch.equal(decoder.token_embedding.weight, table.float())
    finally:
        use_attention_kernels(kernel_model, rows=True)
    assert decoder.token_embedding.weight.dtype == torch.float16


def _step_linears(decoder) -> list[torch.Tensor]:
    return [
        w
        for b in decoder.blocks
        for w in (b.attn.qkv.weight, b.attn.out.weight, b.cross_attn.query.weight, b.cross_attn.out.weight)
        + (b.mlp[0].weight, b.mlp[2].weight)
    ]


def test_float16_valued_linears_are_held_in_float16_with_the_same_bits_everywhere(kernel_model, speech_dir):
    """The step's linears of tiny.en (stored in float16) are held in float16 for the kernel: a step, a
    prompt (``forward``, which takes the kernel too) and the uncached twin (PyTorch, widening them per
    call) give the bits they give from float32 copies; the three query/key/value layers stay views of
    the fused matrix; the row GEMMs (``rows=False``) get float32 back. A linear with a value a float16
    cannot hold stays float32."""
    import whisperkv
    from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
    from whisperkv.cpu.step_rows import _store_linears

    decoder = kernel_model.decoder
    assert all(w.dtype == torch.float16 for w in _step_linears(decoder))
    attn = decoder.blocks[0].attn
    assert attn.query.weight.data_ptr() == attn.qkv.weight.data_ptr()
    assert decoder.blocks[0].cross_attn.key.weight.dtype == torch.float32  # projected once a window
    mel = pad_or_trim(log_mel_spectrogram(whisperkv.load_audio(speech_dir / "en" / "jfk.flac")), N_FRAMES)
    prompt, step = torch.tensor([[50257, 50362, 440]]), torch.tensor([[1002]] * 2)

    def outputs() -> list[torch.Tensor]:
        cache = decoder.new_cache(cross, batch_size=2)
        prefilled = decoder(prompt.expand(2, -1), cache)
        stepped = decoder.forward_rows([(step, cache)])
        uncached = decoder.forward_uncached(torch.cat([prompt.expand(2, -1), step], 1), features)
        return [prefilled, stepped, uncached]

    with torch.no_grad():
        features = kernel_model.embed_audio(mel[None])
        cross = decoder.project_cross_kv(features, kernel_model.encoder_provenance(mel[None]))
        held = outputs()
        up = decoder.blocks[1].mlp[0]
        original = up.weight[5, 7].item()
        try:
            _store_linears(decoder, half=False)
            assert all(w.dtype == torch.float32 for w in _step_linears(decoder))
            for got, expected in zip(outputs(), held, strict=True):
                assert torch.equal(got, expected)
            use_attention_kernels(kernel_model, rows=False)  # the twin: float32, nothing to widen a step
            assert all(w.dtype == torch.float32 for w in _step_linears(decoder))
            assert attn.value.weight.data_ptr() == attn.qkv.weight.data_ptr() + 2 * 384 * 384 * 4
            use_attention_kernels(kernel_model, rows=True)
            assert all(w.dtype == torch.float16 for w in _step_linears(decoder))
            _store_linears(decoder, half=False)
            up.weight[5, 7] += 1e-7  # not a float16 any more
            _store_linears(decoder, half=True)
            assert up.weight.dtype == torch.float32
            assert sum(w.dtype == torch.float16 for w in _step_linears(decoder)) == 23
        finally:
            _store_linears(decoder, half=False)
            up.weight[5, 7] = original
            _store_linears(decoder, half=True)
    assert all(w.dtype == torch.float16 for w in _step_linears(decoder))


def test_a_model_moved_after_loading_still_steps(speech_dir):
    """``model.float()`` after loading (a common idiom) re-fuses query|key|value as the row-GEMM holder
    the kernel reads and widens the float16-held linears: the same tokens. A float64 model's rows are
    not the kernel's to take: its steps run through PyTorch, to the float32 step's logits within 1e-3."""
    import whisperkv

    model = whisperkv.load_model("tiny.en")
    use_attention_kernels(model, rows=True)  # the kernels on, whatever the CPU
    clip = str(speech_dir / "en" / "jfk.flac")
    expected = [s["tokens"] for s in model.transcribe(clip)["segments"]]
    model.float()
    block = model.decoder.blocks[0]
    assert block.mlp[0].weight.dtype == torch.float32 and block.attn.qkv.weight.dtype == torch.float32
    assert [s["tokens"] for s in model.transcribe(clip)["segments"]] == expected

    def prompt_logits(dtype: torch.dtype) -> torch.Tensor:
        features = torch.linspace(-1, 1, 1500 * 384, dtype=dtype).reshape(1, 1500, 384)
        provenance = model.encoder_provenance(torch.zeros(1, 80, 3000))
        with torch.no_grad():
            cache = model.decoder.new_cache(model.decoder.project_cross_kv(features, provenance))
            return model.decoder(torch.tensor([[50257, 50362, 440]]), cache)

    single = prompt_logits(torch.float32)
    model.to(torch.float64)
    assert model.decoder.plan.block(block, torch.zeros(1, 1, 384, dtype=torch.float64), [1], [], []) is None
    assert (prompt_logits(torch.float64) - single).abs().max() < 1e-3


def _gelu_row(library: ctypes.CDLL, values: torch.Tensor) -> torch.Tensor:
    fn = library.wkv_gelu_row
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_long]
    out = values.clone()
    fn(out.data_ptr(), out.numel())
    return out


def test_gelu_gives_the_same_bits_sixteen_at_a_time_and_one_at_a_time(plain_c_library):
    """``wkv_gelu_row``: the AVX-512 path (16 at a time) and the one-value path (a row's tail, a build
    without AVX-512) give the same bits, so no value depends on where in a row it falls; within 5e-7 of
    the exact GELU (PyTorch's is 1e-6 off)."""
    built = load_kernel()
    if built is None:
        pytest.skip("no C compiler: the kernels are not built")
    g = torch.Generator().manual_seed(5)
    values = torch.cat([torch.linspace(-12, 12, 4001), torch.randn(999, generator=g)])
    got = _gelu_row(built.library, values)
    tails = torch.cat([_gelu_row(built.library, values[i : i + 7]) for i in range(0, values.numel(), 7)])
    assert torch.equal(got, tails)  # 7 at a time: every value through the one-value path
    exact = values.double() * 0.5 * (1 + torch.special.erf(values.double() / math.sqrt(2)))
    assert (got.double() - exact).abs().max().item() < 5e-7
    if plain_c_library is not None:
        assert torch.equal(_gelu_row(plain_c_library, values), got)
