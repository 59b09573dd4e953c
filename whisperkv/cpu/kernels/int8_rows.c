/* Int8 linear layers for decoder steps: the int8 compute type's Int8Linear.
 *
 * A decoder step multiplies a few rows (1 per greedy window, 5 per beam-5 window) by every weight
 * matrix once. PyTorch's quantized linear (fbgemm) quantises the whole input with one scale and packs
 * it for a GEMM made for many rows; for one row and 0.4 MB of weights not in the CPU cache it took
 * 100-160 us a call here. Here each row is quantised on its own (8 bits, its own scale and zero point,
 * the range always holding 0, as fbgemm's does), and the weights are stored for the CPU's int8 dot
 * product (AVX512-VNNI's vpdpbusd): 16 output rows x 4 inputs in each 64-byte line, so one load and
 * one instruction make 64 products for one row, with no sum across a register at the end.
 *
 * Because each row has its own scale, a row's numbers depend neither on the other rows in the call
 * (fbgemm's did: one scale for them all) nor on the thread count (each output is one integer sum).
 * Without AVX512-VNNI but with AVX2 the same layout runs through int8_avx2.h (16-bit products, exact);
 * without either, through plain C loops: the same integers, the same result (tested). The plain loops
 * are slower than fbgemm, so cpu/int8_rows.py offers the kernel only where VNNI or AVX2 is.
 * Where the CPU has AMX (Intel's tile unit), calls of AMX_MIN_ROWS rows or more multiply 16 rows by 16
 * outputs by 64 inputs in one instruction (tdpbusd) on the same layout: a block's 16 lanes x 4 inputs
 * per 64-byte line is the layout a tile of weights wants. Integer sums: the same bits as VNNI (tested
 * against wkv_int8_rows_vnni, which never takes it).
 * Built by cpu/build.py, with attend.c, into one library. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#endif
#include "amx.h"
#if !(defined(__AVX512F__) && defined(__AVX512VNNI__)) && defined(__AVX2__)
#define WKV_INT8_AVX2 1
#include "int8_avx2.h"
#endif
#if defined(WKV_AMX_TILES) && defined(__AMX_INT8__)
#define WKV_AMX 1
#endif

#define LANES 16   /* output rows per weight block: one 512-bit register of int32 sums */
#define ROWS 16    /* input rows per pass over a weight block (their sums stay in registers) */
#define MAXIN 5120 /* input width: Whisper's widest (large's MLP, 4 x 1280); sums stay < 255*127*5120 */
#define AMX_GROUPS 3 /* 16-row groups per pass over a weight block: 3 sums + 3 rows + 1 weight tile of 8 */
#ifdef WKV_INT8_AVX2
_Static_assert(WIDE_CHUNK <= 16 * AMX_GROUPS, "a widened pass's rows fit the sums a block keeps");
#endif
#define PARALLEL_ROWS 64 /* rows from which a call quantises (and normalises) them on every thread */
#define AMX_MIN_ROWS 2 /* fewer rows: VNNI (one row through a 16-row tile wastes what VNNI does not) */
/* Weight blocks ahead whose lines a thread asks for while it multiplies one, in matrices of STREAMED
 * bytes or more (the vocabulary: 20 MB for tiny.en, read from memory every step; the hardware's own
 * prefetcher stops at each 4 KB page, which a block of in x 16 bytes crosses). A hint only: the same
 * sums. benchmarks/int8_kernels.py --against 6eff07a: the vocabulary for 1 row 1049-1186 against
 * 1356-1393 us; the layers' small matrices gained nothing (they measured 10-20 % slower with it, and
 * about as much once it was left out for them: the benchmark's own order). */
#define AHEAD 2
#define STREAMED (4L << 20)

/* Weights [out, in] (int8, row-major) into blocks [ceil(out/16)][in/4][16][4]; rows past ``out`` are 0. */
void wkv_int8_pack(const int8_t *w, long out, long in, int8_t *packed)
{
    const long blocks = (out + LANES - 1) / LANES;
    memset(packed, 0, (size_t)(blocks * LANES * in));
    for (long o = 0; o < out; o++)
        for (long k = 0; k < in / 4; k++)
            memcpy(packed + ((o / LANES) * (in / 4) + k) * LANES * 4 + (o % LANES) * 4, w + o * in + 4 * k, 4);
}

/* Quantise one row: xq = round(x / scale) + zero in [0, 255]. */
static void quantise(const float *row, long in, uint8_t *xq, float *scale, int32_t *zero)
{
    float lo = 0.f, hi = 0.f;
    for (long i = 0; i < in; i++) {
        lo = row[i] < lo ? row[i] : lo;
        hi = row[i] > hi ? row[i] : hi;
    }
    const float s = hi > lo ? (hi - lo) / 255.f : 1.f;
    const float inverse = 1.f / s;
    const int32_t z = (int32_t)nearbyintf(-lo * inverse);
    for (long i = 0; i < in; i++) {
        const int32_t q = (int32_t)nearbyintf(row[i] * inverse) + z;
        xq[i] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
    }
    *scale = s;
    *zero = z;
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* ROWS rows at once: every count fixed, so the compiler keeps the ROWS sums in registers. */
static void full_block_sums(const uint8_t *xq, long stride, long in, const int8_t *block,
                            int32_t sums[ROWS][LANES])
{
    __m512i acc[ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_si512();
    for (long k = 0; k < in / 4; k++) {
        const __m512i weights = _mm512_loadu_si512((const void *)(block + k * LANES * 4));
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; r++) {
            int32_t four;
            memcpy(&four, xq + r * stride + 4 * k, 4);
            acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(four), weights);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; r++) _mm512_storeu_si512((void *)sums[r], acc[r]);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* G rows (G <= 8) through one weight block, each row's sum split over S <= 4 interleaved accumulators
 * (when S does not divide the steps, the tail goes to the first): G x S independent chains of dot
 * products, each weight line loaded once for the G rows. Integer sums: any split gives the same
 * totals. Not used for a full ROWS block: with G = 16 it measured slower (vocabulary, 16 rows: 2.60
 * against 2.32 ms) than full_block_sums, whose loops are unrolled by hand. */
static inline __attribute__((always_inline)) void group_sums(const uint8_t *xq, long stride, long in,
                                                             const int8_t *block, int32_t sums[][LANES],
                                                             const int G, const int S)
{
    __m512i acc[8][4];
    for (int r = 0; r < G; r++)
        for (int s = 0; s < S; s++) acc[r][s] = _mm512_setzero_si512();
    const long steps = in / 4;
    long k = 0;
    for (; k + S <= steps; k += S)
        for (int s = 0; s < S; s++) {
            const __m512i weights = _mm512_loadu_si512((const void *)(block + (k + s) * LANES * 4));
            for (int r = 0; r < G; r++) {
                int32_t four;
                memcpy(&four, xq + r * stride + 4 * (k + s), 4);
                acc[r][s] = _mm512_dpbusd_epi32(acc[r][s], _mm512_set1_epi32(four), weights);
            }
        }
    for (; k < steps; k++) {
        const __m512i weights = _mm512_loadu_si512((const void *)(block + k * LANES * 4));
        for (int r = 0; r < G; r++) {
            int32_t four;
            memcpy(&four, xq + r * stride + 4 * k, 4);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(four), weights);
        }
    }
    for (int r = 0; r < G; r++) {
        __m512i total = acc[r][0];
        for (int s = 1; s < S; s++) total = _mm512_add_epi32(total, acc[r][s]);
        _mm512_storeu_si512((void *)sums[r], total);
    }
}
#endif

/* The int32 sums of n <= ROWS quantised rows (``stride`` bytes apart) with one weight block: sums[r][lane]. */
static void block_sums(const uint8_t *xq, long stride, long n, long in, const int8_t *block,
                       int32_t sums[ROWS][LANES])
{
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    if (n == ROWS) {
        full_block_sums(xq, stride, in, block, sums);
        return;
    }
    /* fewer rows (a decoder step's 1-15): up to 8 at a time, each weight line loaded once for them,
     * with enough independent chains (rows x accumulators >= 4) to keep the dot-product unit busy */
    for (long r = 0; r < n;) {
        const long g = n - r > 8 ? 8 : n - r;
        const uint8_t *x = xq + r * stride;
        switch (g) {
        case 1: group_sums(x, stride, in, block, sums + r, 1, 4); break;
        case 2: group_sums(x, stride, in, block, sums + r, 2, 2); break;
        case 3: group_sums(x, stride, in, block, sums + r, 3, 2); break;
        case 4: group_sums(x, stride, in, block, sums + r, 4, 1); break;
        case 5: group_sums(x, stride, in, block, sums + r, 5, 1); break;
        case 6: group_sums(x, stride, in, block, sums + r, 6, 1); break;
        case 7: group_sums(x, stride, in, block, sums + r, 7, 1); break;
        default: group_sums(x, stride, in, block, sums + r, 8, 1); break;
        }
        r += g;
    }
#elif defined(WKV_INT8_AVX2)
    avx2_block_sums(xq, stride, n, in, block, sums);
#else
    for (long r = 0; r < n; r++) {
        int32_t acc[LANES] = {0};
        for (long k = 0; k < in / 4; k++) {
            const int8_t *weights = block + k * LANES * 4;
            const uint8_t *x = xq + r * stride + 4 * k;
            for (int lane = 0; lane < LANES; lane++)
                for (int j = 0; j < 4; j++) acc[lane] += (int32_t)x[j] * (int32_t)weights[lane * 4 + j];
        }
        memcpy(sums[r], acc, sizeof acc);
    }
#endif
}

#ifdef WKV_AMX
/* Tiles (amx.h): 0-2 sums (16 rows x 16 int32), 4-6 rows (16 x 64 bytes), 7 weights (16 x 64 bytes). */

/* The int32 sums of n <= 16 * AMX_GROUPS quantised rows (``stride`` bytes apart, rows up to the next
 * multiple of 16 readable) with one weight block, ``in`` a multiple of 64: sums[r][lane]. */
static void amx_block_sums(const uint8_t *xq, long stride, long n, long in, const int8_t *block,
                           int32_t sums[][LANES])
{
    const long groups = (n + 15) / 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (long s = 0; s < in / 64; s++) {
        _tile_loadd(7, block + s * 16 * LANES * 4, LANES * 4);
        _tile_loadd(4, xq + s * 64, stride);
        _tile_dpbusd(0, 4, 7);
        if (groups > 1) {
            _tile_loadd(5, xq + 16 * stride + s * 64, stride);
            _tile_dpbusd(1, 5, 7);
        }
        if (groups > 2) {
            _tile_loadd(6, xq + 32 * stride + s * 64, stride);
            _tile_dpbusd(2, 6, 7);
        }
    }
    _tile_stored(0, sums[0], LANES * 4);
    if (groups > 1) _tile_stored(1, sums[16], LANES * 4);
    if (groups > 2) _tile_stored(2, sums[32], LANES * 4);
}
#endif

/* One row's outputs of one block from its integer sums: the zero point out, both scales, the bias. */
static inline __attribute__((always_inline)) void epilogue(const int32_t *sums, int32_t zero, float scale,
                                                           const int32_t *w_sum, const float *w_scale,
                                                           const float *bias, float *v, long lanes)
{
    for (long lane = 0; lane < lanes; lane++) {
        const float total = (float)(sums[lane] - zero * w_sum[lane]);
        v[lane] = scale * w_scale[lane] * total + (bias ? bias[lane] : 0.f);
    }
}

void wkv_gelu_row(float *v, long count); /* rows_f32.c: 16 at a time, the same bits wherever a value falls */
void wkv_layer_norm(const float *x, long in, const float *weight, const float *bias, float eps, float *out);

/* A call's rows, each quantised on its own (``quantise``): xq [padded, in] (rows past R zero), scale
 * and zero [R]; and, where int8_avx2.h's widened path takes the call, the same values as int16 (xw),
 * else NULL (where it cannot be allocated too: the pairs then, the same sums). */
struct quantised {
    uint8_t *xq;
    int16_t *xw;
    float *scale;
    int32_t *zero;
};

static void free_quantised(struct quantised *q)
{
    free(q->xq);
    free(q->xw);
    free(q->scale);
    free(q->zero);
}

/* Returns 0, or 2 (nothing held) when a buffer cannot be allocated. */
static int quantise_rows(const float *x, long x_row, long R, long in, long padded, struct quantised *q)
{
    q->xq = malloc((size_t)(padded * in));
    q->scale = malloc(sizeof(float) * (size_t)R);
    q->zero = malloc(sizeof(int32_t) * (size_t)R);
    q->xw = NULL;
    if (!q->xq || !q->scale || !q->zero) {
        free_quantised(q);
        return 2;
    }
    /* each row on its own: the same bits on any thread; in parallel for an encoder window's 1,500 rows */
#pragma omp parallel for schedule(static) if (R >= PARALLEL_ROWS)
    for (long r = 0; r < R; r++) quantise(x + r * x_row, in, q->xq + r * in, q->scale + r, q->zero + r);
    memset(q->xq + R * in, 0, (size_t)((padded - R) * in));
#ifdef WKV_INT8_AVX2
    if (R >= WIDE_MIN_ROWS) q->xw = avx2_widened_rows(q->xq, R, in);
#endif
    return 0;
}

/* y [R, out] (rows ys floats apart) = x [R, in] (rows x_row floats apart) times the packed weights
 * transposed, each output o scaled by w_scale[o], its row sum w_sum[o] taking out the zero point, plus
 * bias (or NULL), then GELU when do_gelu, then + residual[r] (rows rs floats apart, or NULL; it may be
 * y itself). Every row is quantised first; then each thread takes whole weight blocks (16 outputs) and
 * runs all the rows through a block, ROWS at a time (16 * AMX_GROUPS through AMX, WIDE_CHUNK through
 * int8_avx2.h's widened block), while it sits in the CPU's first- or second-level cache: the weights are
 * read from memory once per call, however many rows.
 * ``allow_amx``: AMX where built, permitted, and the call fits it. Returns 0,
 * or 1 when ``in`` is out of range or not a multiple of 4, 2 when the rows' buffer cannot be allocated
 * (nothing written). One copy (noinline) for every entry below: an output's bits never depend on which
 * entry made it. */
static __attribute__((noinline)) int int8_rows(const float *x, long x_row, long R, long in, long out,
                                               const int8_t *packed, const float *w_scale, const int32_t *w_sum,
                                               const float *bias, int do_gelu, const float *residual, long rs,
                                               float *y, long ys, int allow_amx)
{
    if (R < 1 || in < 4 || in > MAXIN || in % 4) return 1;
#ifdef WKV_AMX
    const int amx = allow_amx && R >= AMX_MIN_ROWS && in % 64 == 0 && amx_permitted();
#else
    const int amx = 0;
    (void)allow_amx;
#endif
    const long padded = amx ? (R + 15) / 16 * 16 : R; /* a tile reads 16 rows: the rest are zeros */
    struct quantised q;
    if (quantise_rows(x, x_row, R, in, padded, &q)) return 2;
    uint8_t *xq = q.xq;
    const int16_t *xw = q.xw;
    const long blocks = (out + LANES - 1) / LANES;
#ifdef WKV_INT8_AVX2
    const long chunk = xw ? WIDE_CHUNK : ROWS; /* a thread without its widened block takes them too */
#else
    const long chunk = amx ? 16 * AMX_GROUPS : ROWS;
#endif
    const int stream = out * in >= STREAMED;
#pragma omp parallel
    {
#ifdef WKV_AMX
        if (amx) amx_configure();
#endif
        /* this thread's widened weight block; where it cannot be had, the pairs: the same sums */
        int16_t *wblock = xw ? malloc(sizeof(int16_t) * (size_t)(LANES * in)) : NULL;
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            const int8_t *block = packed + b * (in / 4) * LANES * 4;
            if (stream && b + AHEAD < blocks) /* a later block's lines asked for now: see AHEAD */
                for (long byte = 0; byte < in * LANES; byte += 64) __builtin_prefetch(block + AHEAD * in * LANES + byte);
#ifdef WKV_INT8_AVX2
            if (wblock) avx2_widen_block(block, in, wblock);
#endif
            const long lanes = out - b * LANES < LANES ? out - b * LANES : LANES;
            int32_t sums[16 * AMX_GROUPS][LANES] __attribute__((aligned(64)));
            for (long r0 = 0; r0 < R; r0 += chunk) {
                const long n = R - r0 < chunk ? R - r0 : chunk;
#ifdef WKV_AMX
                if (amx)
                    amx_block_sums(xq + r0 * in, in, n, in, block, sums);
                else
#elif defined(WKV_INT8_AVX2)
                if (wblock)
                    avx2_wide_sums(xw + r0 * in, in, n, wblock, sums);
                else
#endif
                    block_sums(xq + r0 * in, in, n, in, block, sums);
                for (long r = 0; r < n; r++) {
                    float v[LANES] __attribute__((aligned(64))) = {0};
                    if (lanes == LANES) /* a full block: a count the compiler makes one vector of */
                        epilogue(sums[r], q.zero[r0 + r], q.scale[r0 + r], w_sum + b * LANES, w_scale + b * LANES,
                                 bias ? bias + b * LANES : NULL, v, LANES);
                    else
                        epilogue(sums[r], q.zero[r0 + r], q.scale[r0 + r], w_sum + b * LANES, w_scale + b * LANES,
                                 bias ? bias + b * LANES : NULL, v, lanes);
                    if (do_gelu) wkv_gelu_row(v, LANES);
                    float *to = y + (r0 + r) * ys + b * LANES;
                    if (residual)
                        for (long lane = 0; lane < lanes; lane++)
                            to[lane] = residual[(r0 + r) * rs + b * LANES + lane] + v[lane];
                    else
                        memcpy(to, v, sizeof(float) * (size_t)lanes);
                }
            }
        }
#ifdef WKV_AMX
        if (amx) _tile_release();
#endif
        free(wblock);
    }
    free_quantised(&q);
    return 0;
}

/* Int8Linear's product (cpu/int8_rows.py): y [R, out], contiguous. */
int wkv_int8_rows(const float *x, long x_row, long R, long in, long out, const int8_t *packed,
                  const float *w_scale, const int32_t *w_sum, const float *bias, float *y)
{
    return int8_rows(x, x_row, R, in, out, packed, w_scale, w_sum, bias, 0, NULL, 0, y, out, 1);
}

/* wkv_int8_rows without AMX: its twin, which the tests hold it to (the same bits). */
int wkv_int8_rows_vnni(const float *x, long x_row, long R, long in, long out, const int8_t *packed,
                       const float *w_scale, const int32_t *w_sum, const float *bias, float *y)
{
    return int8_rows(x, x_row, R, in, out, packed, w_scale, w_sum, bias, 0, NULL, 0, y, out, 0);
}

/* 1 where calls of enough rows go through AMX here (built for it, and the system lets this process use
 * its tiles), else 0. */
int wkv_int8_rows_amx(void)
{
#ifdef WKV_AMX
    return amx_permitted();
#else
    return 0;
#endif
}

/* An int8 decoder step's linear with everything around it (cpu/int8_step.py), as wkv_rows_f32 does
 * for float32 (rows_f32.c): LayerNorm of the n rows of x (rows xs floats apart) into scratch [n, in]
 * when ln_weight is not NULL (``in`` then a multiple of 16), the product, bias, GELU, residual.
 * Returns 0, or the failure int8_rows gives (3: a LayerNorm over a width not a multiple of 16). */
int wkv_int8_rows_step(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,
                       float *scratch, const int8_t *packed, const float *w_scale, const int32_t *w_sum,
                       const float *bias, long out, long in, int do_gelu, const float *residual, long rs, float *y,
                       long ys)
{
    if (ln_weight) {
        if (in % 16 || n < 1) return 3;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_ROWS)
        for (long r = 0; r < n; r++) wkv_layer_norm(x + r * xs, in, ln_weight, ln_bias, eps, scratch + r * in);
        x = scratch;
        xs = in;
    }
    return int8_rows(x, xs, n, in, out, packed, w_scale, w_sum, bias, do_gelu, residual, rs, y, ys, 1);
}
