/* The bfloat16 encoder's self-attention through AVX512-BF16's dot product (vdpbf16ps), for CPUs that
 * have it without AMX's tiles (AMD Zen 4 and 5; Intel's with AMX use encoder_attend.c).
 *
 * There the encoder attended head by head in PyTorch (cpu/head_by_head.py): per head two bfloat16
 * matrix products through a 1,500 x 1,500 score matrix (4.5 MB) written and read back, and a softmax
 * over it in bfloat16: about half of tiny.en's bfloat16 encoder. Here, as in the tile kernel, each
 * head's keys and values are packed once (keys: 16 keys x a pair of the width per 64-byte line; values:
 * 16 of the width x a pair of keys), then threads take 32 queries of a head at a time, 4 at once: the
 * scores of 4 queries x 64 keys in 16 registers (one vdpbf16ps per line and query), the softmax over
 * each whole row in float32 (the exponent by encoder_attend.c's polynomial), the probabilities rounded
 * to bfloat16 (as SDPA's bfloat16 path rounds them) times the values (4 queries x the 64 columns in 16
 * registers), each output row divided by its float32 sum and written, rounded to bfloat16, straight
 * into [window, position, head x 64]: no score matrix leaves the core's caches.
 *
 * Every output is one chain of products in a fixed order: a window's numbers depend on nothing else in
 * the batch, nor on the thread count. Not SDPA's bits: its twin is the head-by-head path (and SDPA), and
 * both are held to a float32 reference (tests). Built by cpu/build.py into the kernels' library. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx512_math.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define WKV_DOT 1
#endif

#define WIDTH 64 /* every Whisper model's head width */
#define PAIRS 32 /* pairs of the width */
#define ROWS 4   /* queries at once */
#define KEYS 4   /* blocks of 16 keys at once (the scores) */
#define SPAN 64  /* keys a pass of the scores covers (KEYS x 16): T is padded to a multiple */
#define CHUNK 32 /* queries a thread takes at a time */

#ifdef WKV_DOT
/* Keys [T][64] (``stride`` elements apart) into [TP/16][32 pairs][16 keys][2]; keys past T are 0. */
static void pack_keys(const uint16_t *k, long stride, long T, long TP, uint16_t *packed)
{
    for (long key = 0; key < TP; key++) {
        uint32_t *line = (uint32_t *)packed + (key / 16) * PAIRS * 16 + key % 16;
        const uint32_t *pairs = (const uint32_t *)(k + key * stride);
        for (int pair = 0; pair < PAIRS; pair++) line[pair * 16] = key < T ? pairs[pair] : 0;
    }
}

/* Values [T][64] into [TP/2 key pairs][4 column blocks][16 columns][2 keys]; keys past T are 0. */
static void pack_values(const uint16_t *v, long stride, long T, long TP, uint16_t *packed)
{
    for (long key = 0; key < TP; key++) {
        uint16_t *at = packed + (key / 2) * WIDTH * 2 + key % 2;
        for (int c = 0; c < WIDTH; c++) at[c * 2] = key < T ? v[key * stride + c] : 0;
    }
}

/* The scores of ROWS queries (as pairs, [ROWS][32]) with every key: s[r][t], TP per row; t >= T set to
 * -FLT_MAX (no weight after the softmax). */
static void scores(const uint32_t q[ROWS][PAIRS], const uint16_t *kp, long T, long TP, float *s)
{
    for (long b = 0; b < TP / 16; b += KEYS) {
        __m512 acc[ROWS][KEYS];
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < KEYS; j++) acc[r][j] = _mm512_setzero_ps();
        const uint16_t *lines = kp + b * PAIRS * 32;
        for (int pair = 0; pair < PAIRS; pair++) {
            __m512bh w[KEYS];
            for (int j = 0; j < KEYS; j++)
                w[j] = (__m512bh)_mm512_loadu_si512((const void *)(lines + (j * PAIRS + pair) * 32));
            for (int r = 0; r < ROWS; r++) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)q[r][pair]);
                for (int j = 0; j < KEYS; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], x, w[j]);
            }
        }
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < KEYS; j++) _mm512_storeu_ps(s + r * TP + (b + j) * 16, acc[r][j]);
    }
    for (int r = 0; r < ROWS; r++)
        for (long t = T; t < TP; t++) s[r * TP + t] = -FLT_MAX;
}

/* One row of scores (TP floats, a multiple of 16): exp(scale (s - max)) rounded to bfloat16 into p;
 * returns 1 / their float32 sum. Four running maxima and sums: no long chain of dependent additions. */
static float softmax_row(const float *s, long TP, float log2_scale, uint16_t *p)
{
    __m512 top[4], sum[4];
    for (int i = 0; i < 4; i++) top[i] = _mm512_set1_ps(-FLT_MAX), sum[i] = _mm512_setzero_ps();
    for (long t = 0; t < TP; t += 64)
        for (int i = 0; i < 4; i++) top[i] = _mm512_max_ps(top[i], _mm512_loadu_ps(s + t + 16 * i));
    const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(top[0], top[1]), _mm512_max_ps(top[2], top[3])));
    const __m512 shift = _mm512_set1_ps(largest * log2_scale), factor = _mm512_set1_ps(log2_scale);
    for (long t = 0; t < TP; t += 64)
        for (int i = 0; i < 4; i++) {
            const __m512 e = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(s + t + 16 * i), factor, shift));
            sum[i] = _mm512_add_ps(sum[i], e);
            _mm256_storeu_si256((__m256i *)(p + t + 16 * i), (__m256i)_mm512_cvtneps_pbh(e));
        }
    return 1.0f / _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3])));
}

/* ROWS rows of probabilities (p [ROWS][TP] bfloat16) times the packed values: out rows (``rows`` of
 * them written, ``out_stride`` apart), each scaled by inverse[r] and rounded to bfloat16. */
static void weighted_values(const uint16_t *p, const uint16_t *vp, long TP, const float *inverse, long rows,
                            uint16_t *out, long out_stride)
{
    __m512 acc[ROWS][4];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const uint32_t *pairs = (const uint32_t *)p;
    for (long j = 0; j < TP / 2; j++) {
        __m512bh w[4];
        for (int c = 0; c < 4; c++) w[c] = (__m512bh)_mm512_loadu_si512((const void *)(vp + (j * 4 + c) * 32));
        for (int r = 0; r < ROWS; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)pairs[r * (TP / 2) + j]);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, w[c]);
        }
    }
    for (long r = 0; r < rows; r++) {
        const __m512 scale = _mm512_set1_ps(inverse[r]);
        for (int c = 0; c < 4; c++)
            _mm256_storeu_si256((__m256i *)(out + r * out_stride + c * 16),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][c], scale)));
    }
}

/* Queries [first, last) of one head of one window: queries [T][64] ``stride`` elements apart, keys and
 * values packed; out [T][64] ``out_stride`` apart. Buffers: s (ROWS x TP floats), p (ROWS x TP). */
static void attend_rows(const uint16_t *q, long stride, long T, long first, long last, const uint16_t *kp,
                        const uint16_t *vp, float log2_scale, uint16_t *out, long out_stride, float *s,
                        uint16_t *p)
{
    const long TP = (T + SPAN - 1) / SPAN * SPAN;
    uint32_t queries[ROWS][PAIRS] __attribute__((aligned(64)));
    float inverse[ROWS];
    for (long m0 = first; m0 < last && m0 < T; m0 += ROWS) {
        const long rows = T - m0 < ROWS ? T - m0 : ROWS;
        for (long r = 0; r < ROWS; r++) {
            if (r < rows) memcpy(queries[r], q + (m0 + r) * stride, WIDTH * 2);
            else memset(queries[r], 0, WIDTH * 2);
        }
        scores(queries, kp, T, TP, s);
        for (long r = 0; r < ROWS; r++) inverse[r] = softmax_row(s + r * TP, TP, log2_scale, p + r * TP);
        weighted_values(p, vp, TP, inverse, rows, out + m0 * out_stride, out_stride);
    }
}
#endif

/* Whether this build can run wkv_encoder_attend_dot (compiled with AVX512-BF16). */
int wkv_encoder_attend_dot_available(void)
{
#ifdef WKV_DOT
    return 1;
#else
    return 0;
#endif
}

/* Self-attention of ``windows`` x ``heads`` heads, bfloat16, as wkv_encoder_attend_bf16 (encoder_attend.c)
 * takes it: element (window w, position t, head h, column d) of the queries, keys and values at
 * w * window_stride + t * stride + h * 64 + d; ``out`` [windows][T][heads * 64]. ``scale`` multiplies
 * the scores. Returns 1, or 0 without touching ``out`` where this build has no AVX512-BF16, -1 when
 * memory runs out. */
int wkv_encoder_attend_dot(const uint16_t *q, const uint16_t *k, const uint16_t *v, long window_stride, long stride,
                           long windows, long heads, long T, float scale, uint16_t *out)
{
#ifdef WKV_DOT
    if (T < 1) return 0;
    const long TP = (T + SPAN - 1) / SPAN * SPAN, heads_all = windows * heads;
    const long packed = 2 * TP * WIDTH; /* one head's keys and values */
    const long chunks = (T + CHUNK - 1) / CHUNK;
    const float log2_scale = scale * 1.4426950408889634f;
    uint16_t *kv = aligned_alloc(64, (size_t)(heads_all * packed * 2));
    if (!kv) return -1;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (long job = 0; job < heads_all; job++) {
            const long at = job / heads * window_stride + job % heads * WIDTH;
            pack_keys(k + at, stride, T, TP, kv + job * packed);
            pack_values(v + at, stride, T, TP, kv + job * packed + TP * WIDTH);
        }
        float *s = aligned_alloc(64, (size_t)ROWS * TP * 4);
        uint16_t *p = aligned_alloc(64, (size_t)ROWS * TP * 2);
        if (!s || !p) failed = 1;
        /* query chunks handed out as threads come free: a thread the system delays leaves its share */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < heads_all * chunks; item++) {
            if (failed) continue;
            const long job = item / chunks, chunk = item % chunks, w = job / heads, h = job % heads;
            attend_rows(q + w * window_stride + h * WIDTH, stride, T, chunk * CHUNK, (chunk + 1) * CHUNK,
                        kv + job * packed, kv + job * packed + TP * WIDTH, log2_scale,
                        out + w * T * heads * WIDTH + h * WIDTH, heads * WIDTH, s, p);
        }
        free(s);
        free(p);
    }
    free(kv);
    return failed ? -1 : 1;
#else
    (void)q, (void)k, (void)v, (void)window_stride, (void)stride, (void)windows, (void)heads, (void)T;
    (void)scale, (void)out;
    return 0;
#endif
}
