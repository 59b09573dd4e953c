/* The int8 type's encoder linears through AMX's bfloat16 tiles (wkv_encoder_linear_bf16) or, with int8
 * weights, its int8 tiles (wkv_encoder_linear_int8, below), each with what follows it.
 *
 * Through PyTorch a bfloat16 linear of the encoder is three passes over its output: the bias copied into
 * it, oneDNN's product added to it, then GELU (the MLP's first linear) or the residual add (the
 * attention's output projection, the MLP's second) as another pass. Here each thread takes 32 rows of
 * the input at a time and makes their output 32 columns at a time in four float32 tiles (two of the
 * input's rows by two of the weight's columns, `tdpbf16ps` over the whole width), then finishes those
 * 32 x 32 while they are in its cache: bias added and rounded to bfloat16 (what addmm gives), GELU on
 * that, rounded again (what PyTorch's bfloat16 GELU gives), and/or the residual added, rounded again (its
 * bfloat16 add). The encoder's two convolutions are such products too, over overlapping rows of their
 * input laid out position by position (cpu/tiled_linear.py). The roundings are PyTorch's; only the products' sum order is not oneDNN's, so an
 * output rounds the other way now and then: the twin is the PyTorch path, tested close against a
 * float32 reference; the int8 type's words are measured (benchmarks/bench.py).
 * Built by cpu/build.py into the kernels' library. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "avx512_math.h"

#if defined(WKV_AMX_TILES) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define WKV_AMX_BF16_LINEAR 1
#endif
#if defined(WKV_AMX_BF16_LINEAR) && defined(__AMX_INT8__) && defined(__AVX512BW__)
#define WKV_AMX_INT8_LINEAR 1
#endif

#define TILE_BYTES 1024 /* one 16 x 64-byte tile */

enum { EPILOGUE_BIAS = 0, EPILOGUE_GELU = 1, EPILOGUE_RESIDUAL = 2, EPILOGUE_GELU_RESIDUAL = 3 };

#ifdef WKV_AMX_BF16_LINEAR
static inline __m512 widen(__m256i bf16) /* 16 bfloat16 to float32, exactly */
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

static inline __m256i narrow(__m512 x) /* float32 to bfloat16, to nearest even (PyTorch's rounding) */
{
    return (__m256i)_mm512_cvtneps_pbh(x);
}

/* GELU of 16 bfloat16 values, x/2 (1 + erf(x / sqrt 2)) in float32, rounded to bfloat16. */
static inline __m256i gelu_bf16(__m256i y)
{
    const __m512 v = widen(y), erf = erf_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)));
    return narrow(_mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)), _mm512_add_ps(erf, _mm512_set1_ps(1.0f))));
}

/* gelu_bf16 of every bfloat16, by its bits: the epilogue looks GELU up instead of computing it. Why: GELU
 * of a 32 x 32 block took as long as the block's products where the input is narrow (K of 384 or 1280:
 * tiny.en's and turbo's first MLP linear), and a gather of 16 took 0.19 ns a value against erf's 0.48
 * (scratch, one core); the same bits, as the table holds what gelu_bf16 gives. Two entries more: a gather
 * reads 4 bytes at each value's 2. Filled once per process (pthread_once), 128 KB. */
static uint16_t gelu_table[65536 + 2];
static pthread_once_t gelu_filled = PTHREAD_ONCE_INIT;

static void fill_gelu_table(void)
{
    for (uint32_t b = 0; b < 65536; b += 16) {
        const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32((int)b), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8,
                                                                                           9, 10, 11, 12, 13, 14, 15));
        _mm256_storeu_si256((__m256i *)(gelu_table + b), gelu_bf16(_mm512_cvtepi32_epi16(bits)));
    }
}

static inline __m256i gelu_lookup(__m256i y)
{
    const __m512i at = _mm512_cvtepu16_epi32(y);
    return _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(at, (const void *)gelu_table, 2));
}

/* Rows [0, rows) of a 32 x 32 block of products ``c`` (float32, 32 apart) finished into ``out``. */
static void finish_block(const float *c, long rows, const float *bias, int epilogue, const uint16_t *residual,
                         long res_stride, uint16_t *out, long out_stride)
{
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < 32; j += 16) {
            __m256i y = narrow(_mm512_add_ps(_mm512_load_ps(c + r * 32 + j), _mm512_loadu_ps(bias + j)));
            if (epilogue == EPILOGUE_GELU || epilogue == EPILOGUE_GELU_RESIDUAL) y = gelu_lookup(y);
            if (epilogue == EPILOGUE_RESIDUAL || epilogue == EPILOGUE_GELU_RESIDUAL) {
                const __m256i res = _mm256_loadu_si256((const __m256i *)(residual + r * res_stride + j));
                y = narrow(_mm512_add_ps(widen(res), widen(y)));
            }
            _mm256_storeu_si256((__m256i *)(out + r * out_stride + j), y);
        }
}

/* What turns an int8 block's sums into values (wkv_encoder_linear_int8); NULL for bfloat16. */
struct dequantise {
    const float *x_scale, *w_scale;
    const int32_t *x_zero, *w_sum;
};
#ifdef WKV_AMX_INT8_LINEAR
static void dequantise_block(float *c, long rows, const struct dequantise *d, long n0);
#endif

/* Output columns [n_begin, n_end) of one block of ``rows`` <= 32 input rows (``a``, 32 rows ``lda`` bytes
 * apart, each step of 64 bytes a tile's width), 32 columns at a time from the packed weights (1 KB a tile a step):
 * four float32 (bfloat16, ``int8`` 0) or int32 (``int8`` 1) tiles of products, two rows of tiles by two
 * columns. Each 32 x 32 block's products are issued before the previous block is finished, so the tile
 * unit multiplies while the vector unit finishes (the two run side by side). ``blocks_c``: two blocks'
 * products (64-byte aligned). ``int8`` a constant where it is called: one copy of the loop for each. */
static inline __attribute__((always_inline)) void row_block(const int int8, const uint8_t *a, long lda,
                                                            const uint8_t *packed, long steps, long n_begin,
                                                            long n_end, long rows,
                                                            float *blocks_c, const struct dequantise *dq,
                                                            const float *bias, int epilogue,
                                                            const uint16_t *residual, long res_stride,
                                                            uint16_t *out, long out_stride)
{
    (void)int8, (void)dq; /* used only where the int8 tiles are built */
    for (long n0 = n_begin; n0 <= n_end; n0 += 32) {
        float *c = blocks_c + (n0 / 32 % 2) * 32 * 32;
        if (n0 < n_end) {
            const uint8_t *b0 = packed + (n0 / 16) * steps * TILE_BYTES, *b1 = b0 + steps * TILE_BYTES;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (long s = 0; s < steps; s++) {
                _tile_loadd(4, a + s * 64, lda);
                _tile_loadd(5, a + 16 * lda + s * 64, lda);
                _tile_loadd(6, b0 + s * TILE_BYTES, 64);
                _tile_loadd(7, b1 + s * TILE_BYTES, 64);
#ifdef WKV_AMX_INT8_LINEAR
                if (int8) {
                    _tile_dpbusd(0, 4, 6);
                    _tile_dpbusd(1, 4, 7);
                    _tile_dpbusd(2, 5, 6);
                    _tile_dpbusd(3, 5, 7);
                    continue;
                }
#endif
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        if (n0 > n_begin) {
            const long p0 = n0 - 32;
            float *done = blocks_c + (p0 / 32 % 2) * 32 * 32;
#ifdef WKV_AMX_INT8_LINEAR
            if (int8) dequantise_block(done, rows, dq, p0);
#endif
            finish_block(done, rows, bias + p0, epilogue, residual ? residual + p0 : NULL, res_stride, out + p0,
                         out_stride);
        }
        if (n0 < n_end) {
            _tile_stored(0, c, 32 * 4); /* tile numbers are constants: no loop */
            _tile_stored(1, c + 16, 32 * 4);
            _tile_stored(2, c + 16 * 32, 32 * 4);
            _tile_stored(3, c + 16 * 32 + 16, 32 * 4);
        }
    }
}

/* The output columns a panel holds: their packed weights (``row_bytes`` each) within PANEL_BYTES, a multiple
 * of 32, at most N. Why panels: a 32-row block reads every weight of the layer once, so blocks taken in
 * row order stream the whole matrix from the last-level cache for each block of 32 rows (47 times a
 * window); taken panel by panel, a panel's weights stay in the core's own 2 MB L2 while every row block
 * goes through it. At large-v3-turbo's width (bfloat16, 1,500 rows, 2 threads; scratch, medians of 6) the
 * MLP's linears took 8.2-9.2 and 8.9-9.0 ms against 13-16 and 10.6-12.7, query|key|value 6.1-6.3 against
 * 8.2-10; tiny.en's (one or two panels) as before. The same products in the same order: the same bits. */
#define PANEL_BYTES (1L << 20)
static long panel_columns(long row_bytes, long N)
{
    const long columns = PANEL_BYTES / row_bytes / 32 * 32;
    return columns < 32 ? 32 : columns > N ? N : columns;
}
#endif

/* Whether this build and this process can run wkv_encoder_linear_bf16. */
int wkv_encoder_linear_available(void)
{
#ifdef WKV_AMX_BF16_LINEAR
    return amx_permitted();
#else
    return 0;
#endif
}

/* out[m][n] = epilogue(sum_k x[m][k] w[n][k] + bias[n]) for m < M, n < N, bfloat16 in and out: x row m at
 * x + m * x_stride; the weight packed as [N / 16][K / 32][16 pairs of k][16 n][2] (cpu/tiled_linear.py);
 * bias N float32 (bfloat16 values); epilogue 0 bias only, 1 GELU, 2 plus residual[m][n] (at
 * residual + m * res_stride), 3 GELU then plus the residual (the encoder's second convolution and its
 * positional embedding). N and K multiples of 32. Returns 1, 0 where this build or process has no
 * AMX (``out`` untouched), -1 out of memory. */
int wkv_encoder_linear_bf16(const uint16_t *x, long M, long K, long x_stride, const uint16_t *packed, long N,
                            const float *bias, int epilogue, const uint16_t *residual, long res_stride,
                            uint16_t *out, long out_stride)
{
#ifdef WKV_AMX_BF16_LINEAR
    if (!amx_permitted() || M < 1 || N % 32 || K % 32) return 0;
    if (epilogue == EPILOGUE_GELU || epilogue == EPILOGUE_GELU_RESIDUAL) pthread_once(&gelu_filled, fill_gelu_table);
    const long steps = K / 32, blocks = (M + 31) / 32;
    const long panel = panel_columns(K * 2, N), panels = (N + panel - 1) / panel;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *blocks_c = aligned_alloc(64, 2 * 32 * 32 * 4); /* two blocks' products: see row_block */
        uint16_t *tail = aligned_alloc(64, (size_t)32 * K * 2);
        if (!blocks_c || !tail) failed = 1;
        else amx_configure();
        /* panel by panel (panel_columns), its blocks of 32 rows handed out as threads come free (a server's
         * other threads share the cores) */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < panels * blocks; item++) {
            if (failed) continue;
            const long block = item % blocks, nb = item / blocks * panel, ne = nb + panel < N ? nb + panel : N;
            const long m0 = block * 32, rows = M - m0 < 32 ? M - m0 : 32;
            const uint16_t *a = x + m0 * x_stride;
            long lda = x_stride;
            if (rows < 32) { /* the last rows, padded with zeros: a tile reads 16 whole rows */
                memset(tail, 0, (size_t)32 * K * 2);
                for (long r = 0; r < rows; r++) memcpy(tail + r * K, a + r * x_stride, (size_t)K * 2);
                a = tail;
                lda = K;
            }
            row_block(0, (const uint8_t *)a, lda * 2, (const uint8_t *)packed, steps, nb, ne, rows, blocks_c, NULL,
                      bias, epilogue, residual ? residual + m0 * res_stride : NULL, res_stride, out + m0 * out_stride,
                      out_stride);
        }
        if (!failed) _tile_release();
        free(blocks_c);
        free(tail);
    }
    return failed ? -1 : 1;
#else
    (void)x, (void)M, (void)K, (void)x_stride, (void)packed, (void)N, (void)bias, (void)epilogue;
    (void)residual, (void)res_stride, (void)out, (void)out_stride;
    return 0;
#endif
}

/* The int8 encoder's linears (cpu/int8_tiles.py): int8 weights, one scale per output, through AMX's
 * int8 tiles (`tdpbusd`, twice the products of `tdpbf16ps` an instruction, half the weight bytes).
 * The threads first quantise every input row, each on its own (8 bits, its own scale and zero point,
 * the range always holding 0: int8_rows.c's rule), into one buffer, then make the output panel by
 * panel (panel_columns) from it; the integer sums then become
 * scale_x * scale_w * (sum - zero * row_sum_w) + bias in float32, and are finished as the bfloat16
 * kernel's are (rounded to bfloat16, GELU, residual). */
#ifdef WKV_AMX_INT8_LINEAR
/* Row ``r`` of bfloat16 ``x`` (K values) into u8 ``q``: q = round(x / scale) + zero, clamped to [0, 255]. */
static void quantise_row(const uint16_t *x, long K, uint8_t *q, float *scale, int32_t *zero)
{
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    for (long k = 0; k < K; k += 16) {
        const __m512 v = widen(_mm256_loadu_si256((const __m256i *)(x + k)));
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    const float low = _mm512_reduce_min_ps(lo), high = _mm512_reduce_max_ps(hi);
    /* divisions as instructions: -ffast-math would make them products by a reciprocal, another rounding
     * than the twin's (cpu/int8_tiles.py) */
    const float s = high > low ? _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(high - low), _mm_set_ss(255.f))) : 1.f;
    const float inverse = _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(1.f), _mm_set_ss(s)));
    const int32_t z = (int32_t)nearbyintf(-low * inverse);
    const __m512 inv = _mm512_set1_ps(inverse);
    const __m512i zv = _mm512_set1_epi32(z), top = _mm512_set1_epi32(255);
    for (long k = 0; k < K; k += 16) {
        const __m512 v = widen(_mm256_loadu_si256((const __m256i *)(x + k)));
        __m512i t = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), zv); /* to nearest even */
        t = _mm512_min_epi32(_mm512_max_epi32(t, _mm512_setzero_si512()), top);
        _mm_storeu_si128((__m128i *)(q + k), _mm512_cvtepi32_epi8(t));
    }
    *scale = s;
    *zero = z;
}

/* A 32 x 32 block of integer sums ``c`` (int32, 32 apart) of output columns [n0, n0 + 32) into float32 in
 * place: rows [0, rows). */
static void dequantise_block(float *c, long rows, const struct dequantise *d, long n0)
{
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < 32; j += 16) {
            const __m512i sums = _mm512_load_si512((const void *)(c + r * 32 + j));
            const __m512i w_sum = _mm512_loadu_si512(d->w_sum + n0 + j);
            const __m512i zero_sums = _mm512_mullo_epi32(_mm512_set1_epi32(d->x_zero[r]), w_sum);
            const __m512 total = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, zero_sums));
            const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d->x_scale[r]), _mm512_loadu_ps(d->w_scale + n0 + j));
            _mm512_store_ps(c + r * 32 + j, _mm512_mul_ps(scale, total));
        }
}
#endif

/* Whether this build and this process can run wkv_encoder_linear_int8. */
int wkv_encoder_linear_int8_available(void)
{
#ifdef WKV_AMX_INT8_LINEAR
    return amx_permitted();
#else
    return 0;
#endif
}

/* wkv_encoder_linear_bf16's product with int8 weights: packed as [N / 16][K / 64][16 groups of 4 k][16 n][4]
 * (cpu/int8_tiles.py), w_scale[n] and w_sum[n] (the row's int8 sum) beside them; K a multiple of 64, N of
 * 32; x's rows quantised as above. Returns 1, 0 where this build or process has no AMX int8 (``out``
 * untouched), -1 out of memory. */
int wkv_encoder_linear_int8(const uint16_t *x, long M, long K, long x_stride, const int8_t *packed,
                            const float *w_scale, const int32_t *w_sum, long N, const float *bias, int epilogue,
                            const uint16_t *residual, long res_stride, uint16_t *out, long out_stride)
{
#ifdef WKV_AMX_INT8_LINEAR
    if (!amx_permitted() || M < 1 || N % 32 || K % 64) return 0;
    if (epilogue == EPILOGUE_GELU || epilogue == EPILOGUE_GELU_RESIDUAL) pthread_once(&gelu_filled, fill_gelu_table);
    const long steps = K / 64, blocks = (M + 31) / 32;
    const long panel = panel_columns(K, N), panels = (N + panel - 1) / panel;
    /* every row quantised once, first: a row block goes through every panel */
    uint8_t *quantised = aligned_alloc(64, (size_t)blocks * 32 * K);
    float *x_scale = malloc(sizeof(float) * blocks * 32);
    int32_t *x_zero = malloc(sizeof(int32_t) * blocks * 32);
    if (!quantised || !x_scale || !x_zero) {
        free(quantised);
        free(x_scale);
        free(x_zero);
        return -1;
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *blocks_c = aligned_alloc(64, 2 * 32 * 32 * 4); /* two blocks' sums, then their values */
        if (!blocks_c) failed = 1;
        else amx_configure();
#pragma omp for schedule(dynamic)
        for (long block = 0; block < blocks; block++) {
            if (failed) continue;
            const long m0 = block * 32, rows = M - m0 < 32 ? M - m0 : 32;
            uint8_t *a = quantised + m0 * K;
            for (long r = 0; r < rows; r++)
                quantise_row(x + (m0 + r) * x_stride, K, a + r * K, x_scale + m0 + r, x_zero + m0 + r);
            if (rows < 32) memset(a + rows * K, 0, (size_t)((32 - rows) * K)); /* a tile reads 16 whole rows */
        }
        /* panel by panel (panel_columns), its blocks of 32 rows handed out as threads come free */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < panels * blocks; item++) {
            if (failed) continue;
            const long block = item % blocks, nb = item / blocks * panel, ne = nb + panel < N ? nb + panel : N;
            const long m0 = block * 32, rows = M - m0 < 32 ? M - m0 : 32;
            const struct dequantise dq = {x_scale + m0, w_scale, x_zero + m0, w_sum};
            row_block(1, quantised + m0 * K, K, (const uint8_t *)packed, steps, nb, ne, rows, blocks_c, &dq, bias,
                      epilogue, residual ? residual + m0 * res_stride : NULL, res_stride, out + m0 * out_stride,
                      out_stride);
        }
        if (!failed) _tile_release();
        free(blocks_c);
    }
    free(quantised);
    free(x_scale);
    free(x_zero);
    return failed ? -1 : 1;
#else
    (void)x, (void)M, (void)K, (void)x_stride, (void)packed, (void)w_scale, (void)w_sum, (void)N, (void)bias;
    (void)epilogue, (void)residual, (void)res_stride, (void)out, (void)out_stride;
    return 0;
#endif
}
