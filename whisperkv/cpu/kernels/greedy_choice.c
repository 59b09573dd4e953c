/* A greedy step's logit filters and the numbers its token choice needs, in one pass over one row.
 *
 * After the decoder, a greedy float32 step used to make five passes over its 51,864 logits through
 * PyTorch (the filters' fills, a log-softmax into a new row, a logsumexp of the timestamps, the amax of
 * the text, an argmax): 0.4-0.5 ms of a 3 ms step in a transcription. This sets the filtered ranges to
 * -inf and then gives, for the row's two parts (text ids [0, split), timestamps [split, n)), each part's
 * largest logit, the first index holding it, and the sum of exp(logit - that largest) in double.
 * decoding/greedy_choice.py decides the token and its log-probability from those six numbers.
 *
 * Built with -ffast-math (cpu/build.py): -inf is never tested by a float compare here, only
 * through its bits, and exp only sees differences clamped at -150 (where exp is 0 in float32). */
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline int is_negative_infinity(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits == 0xff800000u;
}

#if defined(__AVX512F__)
#include <immintrin.h>
#include "avx512_math.h"

/* Largest value of x[0, n) (n > 0): -inf when every value is. */
static float part_max(const float *x, long n)
{
    __m512 best = _mm512_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 16 <= n; j += 16) best = _mm512_max_ps(best, _mm512_loadu_ps(x + j));
    if (j < n) best = _mm512_mask_max_ps(best, (__mmask16)((1u << (n - j)) - 1), best, _mm512_loadu_ps(x + j));
    return _mm512_reduce_max_ps(best);
}

/* The first index of x[0, n) holding top's bits' value (an equal compare: -0.0 matches +0.0). */
static long part_first(const float *x, long n, float top)
{
    const __m512 want = _mm512_set1_ps(top);
    long j = 0;
    for (; j + 16 <= n; j += 16) {
        __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), want, _CMP_EQ_OQ);
        if (hit) return j + __builtin_ctz(hit);
    }
    for (; j < n; j++)
        if (x[j] == top) return j;
    return 0;
}

/* Sum of exp(x[j] - top) over x[0, n), each term in float32 (about an ulp), added up in double. */
static double part_sum(const float *x, long n, float top)
{
    const __m512 shift = _mm512_set1_ps(top), floor = _mm512_set1_ps(-150.0f);
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    long j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp_nonpositive(_mm512_max_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift), floor));
        low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    if (j < n) {
        __mmask16 tail = (__mmask16)((1u << (n - j)) - 1);
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, x + j);
        __m512 e = exp_nonpositive(_mm512_max_ps(_mm512_sub_ps(v, shift), floor));
        e = _mm512_maskz_mov_ps(tail, e);
        low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(low, high));
}
#else
static float part_max(const float *x, long n)
{
    float best = x[0];
    for (long j = 1; j < n; j++) best = x[j] > best ? x[j] : best;
    return best;
}

static long part_first(const float *x, long n, float top)
{
    for (long j = 0; j < n; j++)
        if (x[j] == top) return j;
    return 0;
}

static double part_sum(const float *x, long n, float top)
{
    double sum = 0.0;
    for (long j = 0; j < n; j++) sum += (double)expf(fmaxf(x[j] - top, -150.0f));
    return sum;
}
#endif

/* x: one row of n logits, edited in place: x[ranges[2i], ranges[2i + 1]) = -inf for i < n_ranges.
 * Then for part 0 = [0, split) and part 1 = [split, n): top[p] its largest value, first[p] the first
 * index (into x) holding it, sums[p] the sum of exp(x - top[p]) over the part (0 where the part is
 * empty or all -inf; then top[p] is -inf and first[p] the part's start). Returns 0, or -1 when a range
 * or split lies outside the row (nothing written). */
int wkv_greedy_row(float *x, long n, long split, const long *ranges, long n_ranges, float *top, long *first,
                   double *sums)
{
    if (split < 0 || split > n) return -1;
    for (long i = 0; i < n_ranges; i++)
        if (ranges[2 * i] < 0 || ranges[2 * i] > ranges[2 * i + 1] || ranges[2 * i + 1] > n) return -1;
    for (long i = 0; i < n_ranges; i++)
        for (long j = ranges[2 * i]; j < ranges[2 * i + 1]; j++) x[j] = -INFINITY;
    const long starts[2] = {0, split}, ends[2] = {split, n};
    for (int p = 0; p < 2; p++) {
        const float *part = x + starts[p];
        long count = ends[p] - starts[p];
        top[p] = -INFINITY;
        first[p] = starts[p];
        sums[p] = 0.0;
        if (count == 0) continue;
        float best = part_max(part, count);
        top[p] = best;
        if (is_negative_infinity(best)) continue;
        first[p] = starts[p] + part_first(part, count, best);
        sums[p] = part_sum(part, count, best);
    }
    return 0;
}
