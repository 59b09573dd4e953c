/* Bfloat16 linear layers for decoder steps: the bfloat16 compute type's Bfloat16Linear.
 *
 * A decoder step multiplies a few rows (1 per greedy window, 5 per beam-5 window) by every weight
 * matrix once; the weights are not in the CPU cache, so a step's time follows the bytes it reads. Here
 * the weights are bfloat16 (2 bytes) and so are the rows, rounded once per call (to nearest, ties to
 * even: _mm512_cvtneps_pbh): AVX512-BF16's dot product (vdpbf16ps) multiplies 16 outputs x 2 inputs of
 * bfloat16 into float32 sums in one instruction, twice the products of a float32 fused multiply-add
 * and no widening of the weights. The weights are stored for it: groups of 64 outputs, and within a
 * group, for each pair of inputs, the 64 outputs' two values side by side (four 64-byte lines: one
 * vdpbf16ps each), so a group is one contiguous stream and no sum needs adding across a register.
 *
 * Every output of every row is ONE chain of vdpbf16ps along the inputs, in order, whatever the number
 * of rows in the call, their order or the thread count: a row's numbers never depend on the rows beside
 * it, so a window batched with others gets the bits it gets alone. Independent chains come from the
 * four 16-output blocks of a group and the rows of a pass (up to ROWS), not from splitting a sum.
 *
 * Built by cpu/build.py with the other kernels. Without AVX512-BF16 (compiled for another CPU) every
 * entry returns 4 and wkv_bf16_rows_built() 0: cpu/bf16_rows.py then offers no kernel, and the
 * bfloat16 type runs its PyTorch twin. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#define WKV_BF16 1
#endif

#define LANES 16              /* outputs per 512-bit register of float32 sums */
#define BLOCKS 4              /* 16-output blocks per group */
#define GROUP (LANES * BLOCKS) /* outputs per group: 64 */
#define ROWS 6                /* rows per pass over a group: 4 x 6 sums held in registers */
/* Matrices of STREAMED bytes or more (the vocabulary, 40 MB for tiny.en, read from memory every step)
 * ask for the lines AHEAD bytes on while they multiply: the hardware's own prefetcher stops at each
 * 4 KB page. A hint only: the same sums. */
#define STREAMED (4L << 20)
#define AHEAD 2048

void wkv_gelu_row(float *v, long count); /* rows_f32.c: 16 at a time, the same bits wherever a value falls */
void wkv_layer_norm(const float *x, long in, const float *weight, const float *bias, float eps, float *out);

/* Weights [out, in] (bfloat16 bits, row-major, ``in`` even) into groups [ceil(out/64)][in/2][64][2];
 * outputs past ``out`` are 0. */
void wkv_bf16_pack(const uint16_t *w, long out, long in, uint16_t *packed)
{
    const long groups = (out + GROUP - 1) / GROUP, pairs = in / 2;
    memset(packed, 0, sizeof(uint16_t) * (size_t)(groups * GROUP * in));
    for (long o = 0; o < out; o++) {
        uint16_t *at = packed + (o / GROUP) * pairs * GROUP * 2 + (o % GROUP) * 2;
        const uint16_t *row = w + o * in;
        for (long p = 0; p < pairs; p++) memcpy(at + p * GROUP * 2, row + 2 * p, 2 * sizeof(uint16_t));
    }
}

/* 1 where this library was built with AVX512-BF16 (the kernel runs), else 0. */
int wkv_bf16_rows_built(void)
{
#ifdef WKV_BF16
    return 1;
#else
    return 0;
#endif
}

#ifdef WKV_BF16
/* G rows' (pairs of bfloat16 as 32-bit words, ``stride`` words apart) sums with one group's weights:
 * sums[r][0..63]. Every count fixed, so the compiler keeps the 4 x G sums in registers. */
static inline __attribute__((always_inline)) void group_sums(const uint32_t *xp, long stride, const uint16_t *wg,
                                                             long pairs, int stream, float sums[ROWS][GROUP],
                                                             const int G)
{
    __m512 acc[ROWS][BLOCKS];
    for (int r = 0; r < G; r++)
        for (int b = 0; b < BLOCKS; b++) acc[r][b] = _mm512_setzero_ps();
    for (long p = 0; p < pairs; p++) {
        const uint16_t *line = wg + p * GROUP * 2;
        if (stream)
            for (int b = 0; b < BLOCKS; b++) __builtin_prefetch((const char *)(line + b * 32) + AHEAD);
        __m512bh w[BLOCKS];
        for (int b = 0; b < BLOCKS; b++) w[b] = (__m512bh)_mm512_loadu_si512((const void *)(line + b * 32));
        for (int r = 0; r < G; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)xp[r * stride + p]);
            for (int b = 0; b < BLOCKS; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], x, w[b]);
        }
    }
    for (int r = 0; r < G; r++)
        for (int b = 0; b < BLOCKS; b++) _mm512_storeu_ps(sums[r] + b * LANES, acc[r][b]);
}

static void pass_sums(const uint32_t *xp, long stride, long n, const uint16_t *wg, long pairs, int stream,
                      float sums[ROWS][GROUP])
{
    switch (n) {
    case 1: group_sums(xp, stride, wg, pairs, stream, sums, 1); break;
    case 2: group_sums(xp, stride, wg, pairs, stream, sums, 2); break;
    case 3: group_sums(xp, stride, wg, pairs, stream, sums, 3); break;
    case 4: group_sums(xp, stride, wg, pairs, stream, sums, 4); break;
    case 5: group_sums(xp, stride, wg, pairs, stream, sums, 5); break;
    default: group_sums(xp, stride, wg, pairs, stream, sums, ROWS); break;
    }
}

/* n rows of x (rows xs floats apart, ``in`` a multiple of 16) rounded to bfloat16 into xb [n, in]. */
static void round_rows(const float *x, long xs, long n, long in, uint16_t *xb)
{
    for (long r = 0; r < n; r++)
        for (long k = 0; k < in; k += 16) {
            const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + r * xs + k));
            _mm256_storeu_si256((__m256i *)(xb + r * in + k), (__m256i)v);
        }
}
#endif

/* y [n, out] (rows ys floats apart) = bfloat16(x) [n, in] (rows xs floats apart) times the packed
 * weights transposed, plus bias (or NULL), then GELU when do_gelu, then + residual[r] (rows rs floats
 * apart, or NULL; it may be y itself). Each thread takes whole groups (64 outputs) and runs every row
 * through a group, ROWS at a time, while it sits in the CPU's caches: the weights are read from memory
 * once per call, however many rows. Returns 0, 1 when ``in`` is not a positive multiple of 16, 2 when
 * the rows' buffer cannot be allocated, 4 when built without AVX512-BF16 (nothing written). */
static __attribute__((noinline)) int bf16_rows(const float *x, long xs, long n, long in, long out,
                                               const uint16_t *packed, const float *bias, int do_gelu,
                                               const float *residual, long rs, float *y, long ys)
{
#ifdef WKV_BF16
    if (n < 1 || in < 16 || in % 16 || out < 1) return 1;
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(n * in));
    if (!xb) return 2;
    round_rows(x, xs, n, in, xb);
    const long groups = (out + GROUP - 1) / GROUP, pairs = in / 2;
    const int stream = out * in * 2 >= STREAMED;
    const uint32_t *xp = (const uint32_t *)xb;
#pragma omp parallel for schedule(static)
    for (long g = 0; g < groups; g++) {
        const uint16_t *wg = packed + g * pairs * GROUP * 2;
        const long o0 = g * GROUP, width = out - o0 < GROUP ? out - o0 : GROUP;
        float sums[ROWS][GROUP] __attribute__((aligned(64)));
        for (long r0 = 0; r0 < n; r0 += ROWS) {
            const long rows = n - r0 < ROWS ? n - r0 : ROWS;
            pass_sums(xp + r0 * pairs, pairs, rows, wg, pairs, stream, sums);
            for (long r = 0; r < rows; r++) {
                float *v = sums[r];
                if (bias)
                    for (long o = 0; o < width; o++) v[o] += bias[o0 + o];
                if (do_gelu) wkv_gelu_row(v, GROUP);
                float *to = y + (r0 + r) * ys + o0;
                if (residual) {
                    const float *add = residual + (r0 + r) * rs + o0;
                    for (long o = 0; o < width; o++) to[o] = add[o] + v[o];
                } else
                    memcpy(to, v, sizeof(float) * (size_t)width);
            }
        }
    }
    free(xb);
    return 0;
#else
    (void)x, (void)xs, (void)n, (void)in, (void)out, (void)packed, (void)bias, (void)do_gelu;
    (void)residual, (void)rs, (void)y, (void)ys;
    return 4;
#endif
}

/* Bfloat16Linear's product (cpu/bf16_rows.py): y [n, out], contiguous. */
int wkv_bf16_rows(const float *x, long xs, long n, long in, long out, const uint16_t *packed, const float *bias,
                  float *y)
{
    return bf16_rows(x, xs, n, in, out, packed, bias, 0, NULL, 0, y, out);
}

/* A bfloat16 decoder step's linear with everything around it (cpu/bf16_step.py), as wkv_rows_f32 does
 * for float32 (rows_f32.c): the kernels' LayerNorm of the n rows of x (rows xs floats apart) into
 * scratch [n, in] when ln_weight is not NULL, the product, bias, GELU, residual. Returns 0, or the
 * failure bf16_rows gives. */
int wkv_bf16_rows_step(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,
                       float *scratch, const uint16_t *packed, const float *bias, long out, long in, int do_gelu,
                       const float *residual, long rs, float *y, long ys)
{
    if (ln_weight) {
        if (in % 16 || n < 1) return 1;
        for (long r = 0; r < n; r++) wkv_layer_norm(x + r * xs, in, ln_weight, ln_bias, eps, scratch + r * in);
        x = scratch;
        xs = in;
    }
    return bf16_rows(x, xs, n, in, out, packed, bias, do_gelu, residual, rs, y, ys);
}
