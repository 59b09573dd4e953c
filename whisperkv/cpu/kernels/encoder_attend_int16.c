/* The int8 type's encoder self-attention on a CPU with AVX2 and FMA but no native bfloat16 products (AMD
 * Zen 3, Intel before Cooper Lake), in 16-bit integers.
 *
 * Why: there the int8 type's encoder (fbgemm's linears) attended through PyTorch's float32 SDPA, about
 * half of tiny.en's window and a third of large-v3-turbo's (2-core Zen 3, 110-133 GFLOP/s against the
 * ~200 of float32 FMAs). AVX2's vpmaddwd makes 16 products of 16-bit integers an instruction, twice an
 * FMA's 8 (Zen 3 issues two of either a cycle; its int8 products, vpmaddubsw, saturate). So each head's
 * keys are quantised per key and its queries per query to 13 bits (+-4,095: 64 products add to under
 * 2^30), its values per column to 12 bits (+-2,047), and each row of the softmax to integer weights, its
 * largest 32,767 unless they would add to more than 1,000,000 (then smaller): 1,000,000 + the rounding's
 * T/2, times 2,047, stays under 2^31. Weights relative to the row's largest, not to their sum, keep the
 * many small weights of a spread-out row (most of the encoder's heads): with 16-bit probabilities of 1
 * and 16-bit values the encoder's output was 4x further from float32's (1.3e-3 against 2.8e-4 mean
 * absolute distance, jfk, tiny.en with float32 linears). Both products are exact integer sums; the
 * scores and the softmax are float32. Layout and flow as encoder_attend_dot.c's: each head's keys and
 * values packed once, threads take 32 queries of a head at a time, ROWS at once (8 keys x 2 a pass for
 * the scores, 8 columns x 2 for the values), their scores and weights kept in the core's caches, the
 * output written straight into [window, position, head x 64].
 *
 * A window's numbers depend on nothing else in the batch, nor on the thread count (the integer sums are
 * exact, the float steps per row in a fixed order). Not SDPA's bits: its twin is SDPA, and both are held
 * to a float64 reference (tests/test_int16_attention.py). Built by cpu/build.py into the kernels'
 * library. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define WKV_INT16 1
#endif

#define WIDTH 64             /* every Whisper model's head width */
#define PAIRS 32             /* pairs of the width */
#define ROWS 4               /* queries at once */
#define KEYS 2               /* blocks of 8 keys at once (the scores): 8 accumulators, 2 keys, a query, a product */
#define SPAN (KEYS * 8)      /* keys a pass of the scores covers: T is padded to a multiple (of 16, too) */
#define COLUMNS 2            /* blocks of 8 columns at once (the values) */
#define CHUNK 32             /* queries a thread takes at a time */
#define KEY_RANGE 4095.0f    /* queries and keys: 64 x 4,095^2 < 2^30 */
#define VALUE_RANGE 2047.0f  /* values, per column: 12 bits */
#define PROB_RANGE 32767.0f  /* a softmax row's largest integer weight */
#define PROB_SUM 1000000.0f  /* the most a row's weights add to (before rounding): x 2,047 < 2^31 */

#ifdef WKV_INT16
/* acc + the pairwise products of x and w (16-bit, summed in pairs into 32 bits). In asm so that gcc keeps
 * each accumulator in its register: its intrinsics' version moved every sum through another register
 * and folded each key line's load into every row's product, about 1 product a cycle against 1.5 here. */
static inline __attribute__((always_inline)) __m256i madd_add(__m256i acc, __m256i x, __m256i w)
{
    __m256i product;
    __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(product) : "x"(x), "x"(w));
    return acc;
}

/* x[64] times ``inverse`` (eight lanes each, ``step`` 8 for a vector per 8 columns, 0 for one factor)
 * rounded to 16-bit integers into q[64]. */
static inline void round_row(const float *x, const float *inverse, int step, int16_t *q)
{
    for (int i = 0; i < WIDTH; i += 16) {
        const __m256 low = _mm256_loadu_ps(inverse + i / 8 * step);
        const __m256 high = _mm256_loadu_ps(inverse + (i / 8 + 1) * step);
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), low));
        const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), high));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
}

/* The largest of eight lanes. */
static inline float lanes_max(__m256 x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

/* x[64] rounded to integers in [-range, range] by its largest magnitude; returns the scale that takes
 * them back (0 for a row of zeros, then all 0). */
static float quantise_row(const float *x, float range, int16_t *q)
{
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 top = _mm256_setzero_ps();
    for (int i = 0; i < WIDTH; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
    const float largest = lanes_max(top);
    float inverse[8];
    for (int i = 0; i < 8; i++) inverse[i] = largest > 0.0f ? range / largest : 0.0f;
    round_row(x, inverse, 0, q);
    return largest / range;
}

/* Keys [T][64] (``stride`` apart) into [TP/8][32 pairs][8 keys][2] and their scales; keys past T are 0. */
static void pack_keys(const float *k, long stride, long T, long TP, int16_t *packed, float *scales)
{
    for (long key = 0; key < TP; key++) {
        int16_t row[WIDTH] = {0};
        scales[key] = key < T ? quantise_row(k + key * stride, KEY_RANGE, row) : 0.0f;
        uint32_t *line = (uint32_t *)packed + (key / 8) * PAIRS * 8 + key % 8;
        for (int pair = 0; pair < PAIRS; pair++) memcpy(line + pair * 8, row + 2 * pair, 4);
    }
}

/* Values [T][64] into [TP/2 key pairs][64 columns][2 keys], each column by its largest magnitude (its
 * scale into ``scales``); keys past T are 0. */
static void pack_values(const float *v, long stride, long T, long TP, int16_t *packed, float *scales)
{
    float top[WIDTH] = {0}, inverse[WIDTH];
    for (long t = 0; t < T; t++)
        for (int c = 0; c < WIDTH; c++) top[c] = fmaxf(top[c], fabsf(v[t * stride + c]));
    for (int c = 0; c < WIDTH; c++) {
        inverse[c] = top[c] > 0.0f ? VALUE_RANGE / top[c] : 0.0f;
        scales[c] = top[c] / VALUE_RANGE;
    }
    for (long key = 0; key < TP; key += 2) {
        int16_t two[2][WIDTH] = {{0}};
        for (int i = 0; i < 2; i++)
            if (key + i < T) round_row(v + (key + i) * stride, inverse, 8, two[i]);
        for (int c = 0; c < WIDTH; c += 8) {
            const __m128i a = _mm_loadu_si128((const __m128i *)(two[0] + c));
            const __m128i b = _mm_loadu_si128((const __m128i *)(two[1] + c));
            _mm_storeu_si128((__m128i *)(packed + key * WIDTH + c * 2), _mm_unpacklo_epi16(a, b));
            _mm_storeu_si128((__m128i *)(packed + key * WIDTH + c * 2 + 8), _mm_unpackhi_epi16(a, b));
        }
    }
}

/* 2^t for t <= 0, relative error ~2e-7 (encoder_attend.c's polynomial); below -126 it is 2^-126. */
static inline __m256 exp2_nonpositive(__m256 t)
{
    t = _mm256_max_ps(t, _mm256_set1_ps(-126.0f));
    const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.3400433e-3f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6760374e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503272e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022107e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001f));
    const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(power));
}

/* The scores of ROWS queries (as pairs, [ROWS][32]) with every key, times the keys' scales: s[r][t], TP
 * per row; t >= T set to -FLT_MAX. */
static void scores(const uint32_t q[ROWS][PAIRS], const int16_t *kp, const float *key_scales, long T, long TP,
                   float *s)
{
    for (long b = 0; b < TP / 8; b += KEYS) {
        __m256i acc[ROWS][KEYS];
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < KEYS; j++) acc[r][j] = _mm256_setzero_si256();
        const int16_t *lines = kp + b * PAIRS * 16;
        for (int pair = 0; pair < PAIRS; pair++) {
            __m256i w[KEYS];
            for (int j = 0; j < KEYS; j++)
                w[j] = _mm256_loadu_si256((const __m256i *)(lines + (j * PAIRS + pair) * 16));
            for (int r = 0; r < ROWS; r++) {
                const __m256i x = _mm256_set1_epi32((int)q[r][pair]);
                for (int j = 0; j < KEYS; j++) acc[r][j] = madd_add(acc[r][j], x, w[j]);
            }
        }
        for (int j = 0; j < KEYS; j++) {
            const __m256 scale = _mm256_loadu_ps(key_scales + (b + j) * 8);
            for (int r = 0; r < ROWS; r++)
                _mm256_storeu_ps(s + r * TP + (b + j) * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][j]), scale));
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (long t = T; t < TP; t++) s[r * TP + t] = -FLT_MAX;
}

/* One row of scores (TP floats, a multiple of 16) into integer weights p_t = round(c e_t), e_t = 2^(factor
 * (s_t - max)) <= 1: c = 32,767 (the largest weight in 15 bits) unless the weights would then add to
 * more than PROB_SUM (a spread-out row: c = PROB_SUM / sum e). Returns 1 / (c sum e), which makes them
 * probabilities. (1 / their integer sum would make them add to exactly 1, but took the encoder's output
 * further from float32's on speech: 4.3e-4 against 2.8e-4 mean, jfk, tiny.en; the rounding of a row's
 * many tiny weights is biased, and this keeps each weight's own error.) ``factor`` > 0 (a query of zeros
 * would make it 0, and the keys past T weigh as much as the rest). Two running maxima and sums: no long
 * chain of dependent adds. */
static float softmax_row(float *s, long TP, float factor, int16_t *p)
{
    __m256 top0 = _mm256_set1_ps(-FLT_MAX), top1 = top0;
    for (long t = 0; t < TP; t += 16) {
        top0 = _mm256_max_ps(top0, _mm256_loadu_ps(s + t));
        top1 = _mm256_max_ps(top1, _mm256_loadu_ps(s + t + 8));
    }
    const float largest = lanes_max(_mm256_max_ps(top0, top1));
    const __m256 shift = _mm256_set1_ps(largest * factor), scale = _mm256_set1_ps(factor);
    __m256 sum0 = _mm256_setzero_ps(), sum1 = sum0;
    for (long t = 0; t < TP; t += 16) {
        const __m256 e0 = exp2_nonpositive(_mm256_fmsub_ps(_mm256_loadu_ps(s + t), scale, shift));
        const __m256 e1 = exp2_nonpositive(_mm256_fmsub_ps(_mm256_loadu_ps(s + t + 8), scale, shift));
        sum0 = _mm256_add_ps(sum0, e0);
        sum1 = _mm256_add_ps(sum1, e1);
        _mm256_storeu_ps(s + t, e0);
        _mm256_storeu_ps(s + t + 8, e1);
    }
    float lanes[8], total = 0.0f;
    _mm256_storeu_ps(lanes, _mm256_add_ps(sum0, sum1));
    for (int i = 0; i < 8; i++) total += lanes[i];
    const float c = fminf(PROB_RANGE, PROB_SUM / total);
    const __m256 unit = _mm256_set1_ps(c);
    for (long t = 0; t < TP; t += 16) {
        const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + t), unit));
        const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + t + 8), unit));
        _mm256_storeu_si256((__m256i *)(p + t), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
    return 1.0f / (c * total);
}

/* ROWS rows of weights (p [ROWS][TP]) times the packed values: ``rows`` output rows written (``out_stride``
 * apart), each column times its scale and the row's ``inverse``. */
static void weighted_values(const int16_t *p, const int16_t *vp, long TP, const float *column_scales,
                            const float *inverse, long rows, float *out, long out_stride)
{
    const uint32_t *pairs = (const uint32_t *)p;
    for (int cb = 0; cb < WIDTH / 8; cb += COLUMNS) {
        __m256i acc[ROWS][COLUMNS];
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < COLUMNS; c++) acc[r][c] = _mm256_setzero_si256();
        for (long j = 0; j < TP / 2; j++) {
            __m256i w[COLUMNS];
            for (int c = 0; c < COLUMNS; c++)
                w[c] = _mm256_loadu_si256((const __m256i *)(vp + j * WIDTH * 2 + (cb + c) * 16));
            for (int r = 0; r < ROWS; r++) {
                const __m256i x = _mm256_set1_epi32((int)pairs[r * (TP / 2) + j]);
                for (int c = 0; c < COLUMNS; c++) acc[r][c] = madd_add(acc[r][c], x, w[c]);
            }
        }
        for (int c = 0; c < COLUMNS; c++) {
            const __m256 scale = _mm256_loadu_ps(column_scales + (cb + c) * 8);
            for (long r = 0; r < rows; r++) {
                const __m256 sums = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][c]), _mm256_set1_ps(inverse[r]));
                _mm256_storeu_ps(out + r * out_stride + (cb + c) * 8, _mm256_mul_ps(sums, scale));
            }
        }
    }
}

/* Queries [first, last) of one head of one window: queries [T][64] ``stride`` apart, keys and values
 * packed with their scales; out [T][64] ``out_stride`` apart. Buffers: s (ROWS x TP floats), p (ROWS x
 * TP int16). */
static void attend_rows(const float *q, long stride, long T, long first, long last, const int16_t *kp,
                        const float *key_scales, const int16_t *vp, const float *column_scales, float scale,
                        float *out, long out_stride, float *s, int16_t *p)
{
    const long TP = (T + SPAN - 1) / SPAN * SPAN;
    uint32_t queries[ROWS][PAIRS] __attribute__((aligned(32)));
    float factor[ROWS], inverse[ROWS];
    for (long m0 = first; m0 < last && m0 < T; m0 += ROWS) {
        const long rows = T - m0 < ROWS ? T - m0 : ROWS;
        for (long r = 0; r < ROWS; r++) {
            int16_t row[WIDTH] = {0};
            const float unit = r < rows ? quantise_row(q + (m0 + r) * stride, KEY_RANGE, row) : 0.0f;
            memcpy(queries[r], row, WIDTH * 2);
            factor[r] = fmaxf(unit * scale * 1.4426950408889634f, 1e-30f);
        }
        scores(queries, kp, key_scales, T, TP, s);
        for (long r = 0; r < ROWS; r++) inverse[r] = softmax_row(s + r * TP, TP, factor[r], p + r * TP);
        weighted_values(p, vp, TP, column_scales, inverse, rows, out + m0 * out_stride, out_stride);
    }
}
#endif

/* Whether this build can run wkv_encoder_attend_int16 (compiled with AVX2 and FMA). */
int wkv_encoder_attend_int16_available(void)
{
#ifdef WKV_INT16
    return 1;
#else
    return 0;
#endif
}

/* Self-attention of ``windows`` x ``heads`` heads, float32: element (window w, position t, head h, column
 * d) of the queries, keys and values at w * window_stride + t * stride + h * 64 + d; ``out`` [windows][T]
 * [heads * 64], float32. ``scale`` multiplies the scores. Returns 1, or 0 without touching ``out`` where
 * this build has no AVX2 and FMA (or T < 1), -1 when memory runs out. */
int wkv_encoder_attend_int16(const float *q, const float *k, const float *v, long window_stride, long stride,
                             long windows, long heads, long T, float scale, float *out)
{
#ifdef WKV_INT16
    if (T < 1 || T > 32768) return 0; /* the weights' rounding adds up to T/2 to PROB_SUM's bound */
    const long TP = (T + SPAN - 1) / SPAN * SPAN, heads_all = windows * heads;
    const long packed = 2 * TP * WIDTH, scales = TP + WIDTH; /* one head's keys and values; their scales */
    const long chunks = (T + CHUNK - 1) / CHUNK;
    int16_t *kv = aligned_alloc(64, (size_t)(heads_all * packed * 2));
    float *units = malloc((size_t)(heads_all * scales * 4));
    if (!kv || !units) {
        free(kv);
        free(units);
        return -1;
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (long job = 0; job < heads_all; job++) {
            const long at = job / heads * window_stride + job % heads * WIDTH;
            pack_keys(k + at, stride, T, TP, kv + job * packed, units + job * scales);
            pack_values(v + at, stride, T, TP, kv + job * packed + TP * WIDTH, units + job * scales + TP);
        }
        float *s = aligned_alloc(64, (size_t)ROWS * TP * 4);
        int16_t *p = aligned_alloc(64, (size_t)ROWS * TP * 2);
        if (!s || !p) failed = 1;
        /* query chunks handed out as threads come free: a thread the system delays leaves its share */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < heads_all * chunks; item++) {
            if (failed) continue;
            const long job = item / chunks, chunk = item % chunks, w = job / heads, h = job % heads;
            attend_rows(q + w * window_stride + h * WIDTH, stride, T, chunk * CHUNK, (chunk + 1) * CHUNK,
                        kv + job * packed, units + job * scales, kv + job * packed + TP * WIDTH,
                        units + job * scales + TP, scale, out + w * T * heads * WIDTH + h * WIDTH, heads * WIDTH,
                        s, p);
        }
        free(s);
        free(p);
    }
    free(kv);
    free(units);
    return failed ? -1 : 1;
#else
    (void)q, (void)k, (void)v, (void)window_stride, (void)stride, (void)windows, (void)heads, (void)T;
    (void)scale, (void)out;
    return 0;
#endif
}
