/* Few-query attention over cached keys and values: one decoder step of the int8 compute type.
 *
 * A decoder step asks, per window and head, for 1-16 query rows (one per beam) against up to 1,500
 * cached key/value rows. PyTorch's scaled_dot_product_attention runs this through its blocked flash
 * kernel, which is built for long queries; here each (window, head) is one pass over its keys and one
 * over its values, every query row at once, so the cache is read once per step.
 *
 * Each (window, head) is computed by one thread in a fixed order: a row's numbers depend neither on
 * the other windows in the call nor on the thread count. Built by cpu/build.py.
 *
 * Two versions: caches held in float32 (wkv_attend) and in bfloat16 (wkv_attend_bf16, the int8
 * type's caches: half the bytes read per step). A bfloat16 is the top half of a float32, so each
 * cached row is widened once, exactly, into 64 floats on the stack, then read by every query row. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))) && !defined(WKV_PLAIN_ATTEND)
#include <immintrin.h>
#endif

#define HEAD 64
#define MAXQ 16
#define MAXT 1500 /* positions: Whisper's 1,500 audio positions; its text context is 448 */

/* One cached row widened to float32: a float's bits, or a bfloat16's as the top half of a float's. */
static inline void widen_f32(const float *in, float *out)
{
    for (int d = 0; d < HEAD; d++) out[d] = in[d];
}

static inline void widen_bf16(const uint16_t *in, float *out)
{
    for (int d = 0; d < HEAD; d++) {
        union { uint32_t bits; float value; } wide = {.bits = (uint32_t)in[d] << 16};
        out[d] = wide.value;
    }
}

/* The caches are read once per step, from memory or a far cache level, row after row: each row's two
 * or four cache lines are asked for AHEAD rows before they are read (the hardware's own prefetcher
 * stops at each 4 KB page). A hint only: the numbers are the same with or without it. Past a head's
 * last row it touches the next head's rows, or nothing (a prefetch never faults). */
#define AHEAD 64
#define PREFETCH_ROW(ROW, KV)                                                                              \
    do {                                                                                                   \
        for (int line = 0; line < (int)(HEAD * sizeof(KV)); line += 64)                                    \
            __builtin_prefetch((const char *)(ROW) + line);                                                \
    } while (0)

#if defined(__AVX512F__) && !defined(WKV_PLAIN_ATTEND)
/* With AVX-512, two loops run in registers: the scores of 16 keys at a time, and the weighted sum of
 * values for up to 4 query rows at a time. Both give the bits the plain loops below give, built with the
 * same flags (WKV_PLAIN_ATTEND builds those alone: the twin, tested bit for bit): the same products,
 * added in the order gcc vectorises the plain loops into. A dot product: two chains, dims 0-15 fused
 * onto the product of dims 16-31 and 32-47 onto 48-63; the two added; then summed across lanes by
 * halves. A value's sum over positions: one FMA per position, in order. A compiler that vectorised the
 * plain loops otherwise would make the twin test fail there (the numbers stay float32 attention's).
 * Scratch, bfloat16 caches, 1,500 keys: five windows of beam 5 1.50 -> 1.29 ms, one of beam 5 0.20 ->
 * 0.16 ms; one row a window unchanged (memory-bound). */

/* 16 keys' scores for one query: each key's two chains of products, then the 16 vectors summed across
 * their lanes together (a transposing tree: 31 shuffles and adds for 16 sums, where one sum at a time
 * takes 8), adding the same lanes at each level as one sum at a time does: l + 8, l + 4, l + 2, l + 1. */
static inline __attribute__((always_inline)) void scores16(const float *query, const float keys[16][HEAD],
                                                           float *out)
{
    const __m512 q0 = _mm512_load_ps(query), q1 = _mm512_load_ps(query + 16);
    const __m512 q2 = _mm512_load_ps(query + 32), q3 = _mm512_load_ps(query + 48);
    __m512 acc[16], s[8], u[4];
    for (int i = 0; i < 16; i++) {
        const __m512 k0 = _mm512_load_ps(keys[i]), k1 = _mm512_load_ps(keys[i] + 16);
        const __m512 k2 = _mm512_load_ps(keys[i] + 32), k3 = _mm512_load_ps(keys[i] + 48);
        const __m512 low = _mm512_fmadd_ps(q0, k0, _mm512_mul_ps(q1, k1));
        const __m512 high = _mm512_fmadd_ps(q2, k2, _mm512_mul_ps(q3, k3));
        acc[i] = _mm512_add_ps(low, high);
    }
    for (int i = 0; i < 8; i++) /* quarters of keys 2i, 2i+1: [2i: q0+q2, q1+q3 | 2i+1: q0+q2, q1+q3] */
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* quarter q of u[i]: the 4 partial sums of key 4i + q */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD));
    const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
    const __m512 lo = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
    const __m512 hi = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
    /* lane 4q + p now holds key 4p + q's score: put key m in lane m */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, _mm512_add_ps(lo, hi)));
}

static inline __m512 load16_f32(const float *in) { return _mm512_loadu_ps(in); }

static inline __m512 load16_bf16(const uint16_t *in)
{
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)in));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* out[j] = sum over t of p[j * T + t] * values[t] for G <= 4 rows, the sums held in registers. */
#define VALUES_TIMES(NAME, KV, LOAD16)                                                                     \
    static inline __attribute__((always_inline)) void NAME(const float *p, long T, const KV *values,       \
                                                           long vt, float out[][HEAD], const int G)       \
    {                                                                                                      \
        __m512 sum[4][4];                                                                                  \
        for (int j = 0; j < G; j++)                                                                        \
            for (int c = 0; c < 4; c++) sum[j][c] = _mm512_setzero_ps();                                   \
        for (long t = 0; t < T; t++) {                                                                     \
            const KV *row = values + t * vt;                                                               \
            PREFETCH_ROW(row + AHEAD * vt, KV);                                                            \
            const __m512 r0 = LOAD16(row), r1 = LOAD16(row + 16), r2 = LOAD16(row + 32);                    \
            const __m512 r3 = LOAD16(row + 48);                                                            \
            for (int j = 0; j < G; j++) {                                                                  \
                const __m512 weight = _mm512_set1_ps(p[j * T + t]);                                        \
                sum[j][0] = _mm512_fmadd_ps(weight, r0, sum[j][0]);                                        \
                sum[j][1] = _mm512_fmadd_ps(weight, r1, sum[j][1]);                                        \
                sum[j][2] = _mm512_fmadd_ps(weight, r2, sum[j][2]);                                        \
                sum[j][3] = _mm512_fmadd_ps(weight, r3, sum[j][3]);                                        \
            }                                                                                              \
        }                                                                                                  \
        for (int j = 0; j < G; j++)                                                                        \
            for (int c = 0; c < 4; c++) _mm512_store_ps(out[j] + 16 * c, sum[j][c]);                       \
    }                                                                                                      \
    static void NAME##_rows(const float *p, long T, const KV *values, long vt, float out[][HEAD], long Q)   \
    {                                                                                                      \
        for (long j = 0; j < Q; j += 4) {                                                                  \
            switch (Q - j < 4 ? Q - j : 4) {                                                               \
            case 1: NAME(p + j * T, T, values, vt, out + j, 1); break;                                     \
            case 2: NAME(p + j * T, T, values, vt, out + j, 2); break;                                     \
            case 3: NAME(p + j * T, T, values, vt, out + j, 3); break;                                     \
            default: NAME(p + j * T, T, values, vt, out + j, 4); break;                                    \
            }                                                                                              \
        }                                                                                                  \
    }
VALUES_TIMES(values_times_f32, float, load16_f32)
VALUES_TIMES(values_times_bf16, uint16_t, load16_bf16)
#define FAST_LOOPS 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(WKV_PLAIN_ATTEND)
/* With AVX2 (no AVX-512), the weighted sum of values runs in registers, one query row a pass: its 64
 * sums in eight 8-lane registers, one FMA per position in order, as the plain loops below make each
 * sum (the same bits: tested against a WKV_PLAIN_ATTEND build); the plain loops keep them in memory
 * and widen each row to the stack first. 2-core AMD EPYC Zen 3, 1,500 positions, in-process A/B against
 * the plain build: one row 91.7 -> 68.4 us (float32 caches), 66.5 -> 57.5 (bfloat16); five rows
 * 208.6 -> 177.0, 203.5 -> 173.8. The scores stay the plain loops': an 8-key register version of
 * scores16 (the same bits) measured slower than gcc's loops (five rows 177 -> 197 us). */
static inline __m256 load8_f32(const float *in) { return _mm256_loadu_ps(in); }

static inline __m256 load8_bf16(const uint16_t *in)
{
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)in));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

#define VALUES_TIMES(NAME, KV, LOAD8)                                                                      \
    static void NAME##_rows(const float *p, long T, const KV *values, long vt, float out[][HEAD], long Q)   \
    {                                                                                                      \
        for (long j = 0; j < Q; j++) {                                                                     \
            __m256 sum[8];                                                                                 \
            for (int c = 0; c < 8; c++) sum[c] = _mm256_setzero_ps();                                      \
            for (long t = 0; t < T; t++) {                                                                 \
                const KV *row = values + t * vt;                                                           \
                PREFETCH_ROW(row + AHEAD * vt, KV);                                                        \
                const __m256 weight = _mm256_set1_ps(p[j * T + t]);                                        \
                for (int c = 0; c < 8; c++) sum[c] = _mm256_fmadd_ps(weight, LOAD8(row + 8 * c), sum[c]);  \
            }                                                                                              \
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(out[j] + 8 * c, sum[c]);                          \
        }                                                                                                  \
    }
VALUES_TIMES(values_times_f32, float, load8_f32)
VALUES_TIMES(values_times_bf16, uint16_t, load8_bf16)
#define FAST_VALUES 1
#endif

/* The plain loops' scores of whole blocks of 16 keys through scores16 (the rest one at a time, below:
 * t0 ends past the last block), and the weighted sum of values through VALUES_TIMES. */
#ifdef FAST_LOOPS
#define SCORE_BLOCKS(WIDEN)                                                                                \
    for (; t0 + 16 <= T; t0 += 16) {                                                                       \
        float block[16][HEAD] __attribute__((aligned(64)));                                                \
        for (int i = 0; i < 16; i++) {                                                                     \
            PREFETCH_ROW(keys + (t0 + i + AHEAD) * kt, __typeof__(*keys));                                 \
            WIDEN(keys + (t0 + i) * kt, block[i]);                                                         \
        }                                                                                                  \
        for (long j = 0; j < Q; j++) scores16(queries[j], block, scores + j * T + t0);                     \
    }
#define WEIGHTED_VALUES(FAST, WIDEN) FAST##_rows(scores, T, values, vt, acc, Q);
#elif defined(FAST_VALUES)
#define SCORE_BLOCKS(WIDEN)
#define WEIGHTED_VALUES(FAST, WIDEN) FAST##_rows(scores, T, values, vt, acc, Q);
#else
#define SCORE_BLOCKS(WIDEN)
#define WEIGHTED_VALUES(FAST, WIDEN)                                                                       \
    for (long t = 0; t < T; t++) {                                                                         \
        WIDEN(values + t * vt, row);                                                                       \
        for (long j = 0; j < Q; j++) {                                                                     \
            const float p = scores[j * T + t];                                                             \
            for (int d = 0; d < HEAD; d++) acc[j][d] += p * row[d];                                        \
        }                                                                                                  \
    }
#endif

/* q: rows (b * Q + j) at q + row * q_row, head h at column h * HEAD (B windows of Q rows, H heads).
 * k, v: [B, H, T, HEAD] with strides in elements (b, h, t) and unit stride within a row.
 * out: contiguous [B * Q, H * HEAD]. Returns 0, or 1 when Q or T is out of range (nothing written). */
#define WKV_ATTEND(NAME, KV, WIDEN, FAST)                                                                      \
    int NAME(const float *q, long q_row, const KV *k, const KV *v, float *out, long B, long Q, long H,      \
             long T, long kb, long kh, long kt, long vb, long vh, long vt, float scale)                    \
    {                                                                                                      \
        if (Q < 1 || Q > MAXQ || T < 1 || T > MAXT) return 1;                                              \
        _Pragma("omp parallel for schedule(static)") for (long bh = 0; bh < B * H; bh++)                   \
        {                                                                                                  \
            const long b = bh / H, h = bh % H;                                                             \
            const KV *keys = k + b * kb + h * kh;                                                          \
            const KV *values = v + b * vb + h * vh;                                                        \
            float queries[MAXQ][HEAD] __attribute__((aligned(64)));                                        \
            float acc[MAXQ][HEAD] __attribute__((aligned(64)));                                            \
            float row[HEAD] __attribute__((aligned(64)));                                                  \
            float scores[MAXQ * MAXT]; /* 96 KB on the thread's stack: no allocation per call */           \
            for (long j = 0; j < Q; j++) {                                                                 \
                const float *in = q + (b * Q + j) * q_row + h * HEAD;                                      \
                for (int d = 0; d < HEAD; d++) queries[j][d] = in[d] * scale;                              \
            }                                                                                              \
            long t0 = 0;                                                                                   \
            SCORE_BLOCKS(WIDEN)                                                                            \
            for (long t = t0; t < T; t++) {                                                                \
                WIDEN(keys + t * kt, row);                                                                 \
                for (long j = 0; j < Q; j++) {                                                             \
                    float dot = 0.f;                                                                       \
                    for (int d = 0; d < HEAD; d++) dot += queries[j][d] * row[d];                          \
                    scores[j * T + t] = dot;                                                               \
                }                                                                                          \
            }                                                                                              \
            for (long j = 0; j < Q; j++) {                                                                 \
                float *s = scores + j * T;                                                                 \
                float top = s[0];                                                                          \
                for (long t = 1; t < T; t++) top = s[t] > top ? s[t] : top;                                \
                float total = 0.f;                                                                         \
                for (long t = 0; t < T; t++) {                                                             \
                    s[t] = expf(s[t] - top);                                                               \
                    total += s[t];                                                                         \
                }                                                                                          \
                const float inverse = 1.f / total;                                                         \
                for (long t = 0; t < T; t++) s[t] *= inverse;                                              \
                for (int d = 0; d < HEAD; d++) acc[j][d] = 0.f;                                            \
            }                                                                                              \
            WEIGHTED_VALUES(FAST, WIDEN)                                                                   \
            for (long j = 0; j < Q; j++)                                                                   \
                memcpy(out + ((b * Q + j) * H + h) * HEAD, acc[j], sizeof(float) * HEAD);                  \
        }                                                                                                  \
        return 0;                                                                                          \
    }

WKV_ATTEND(wkv_attend, float, widen_f32, values_times_f32)
WKV_ATTEND(wkv_attend_bf16, uint16_t, widen_bf16, values_times_bf16)
