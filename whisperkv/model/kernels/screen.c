/* The vocabulary screen's candidates for one row (model/vocab_screen.py, decoding/screened.py).
 *
 * Token i's float32 logit lies within bound_i = |w_i| * row_weight + |w_i - ŵ_i| * error_weight + 1e-4
 * of its int8 logit a_i; a token can hold the largest logit only if a_i + m_i + bound_i reaches the
 * largest a_j + m_j - bound_j (m: the filters' mask, 0 or -inf). In PyTorch that took seven passes
 * over the 51,864 tokens and as many temporaries (240 us a step here); here it is two passes, 16
 * tokens at a time where AVX-512 is. -inf must stay -inf, and each operation must round as PyTorch's
 * does (no fused multiply-adds), so that both give the same ids (tested): this file is compiled
 * without -ffast-math. */
#include <math.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

static inline float bound_of(const float *row_norm, const float *error_norm, float rw, float ew, long i)
{
    return (row_norm[i] * rw + error_norm[i] * ew) + 1e-4f;
}

#if defined(__AVX512F__)
/* Tokens i..i+15: their masked int8 logits a + m (*masked) and their bounds (returned), as bound_of. */
static inline __m512 bounds16(const float *approx, const float *mask, const float *row_norm,
                              const float *error_norm, __m512 rw, __m512 ew, long i, __m512 *masked)
{
    *masked = _mm512_add_ps(_mm512_loadu_ps(approx + i), _mm512_loadu_ps(mask + i));
    return _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(row_norm + i), rw),
                                       _mm512_mul_ps(_mm512_loadu_ps(error_norm + i), ew)),
                         _mm512_set1_ps(1e-4f));
}
#endif

/* Writes up to max_ids candidate ids (ascending) to ids and the largest lower bound to *floor_out;
 * returns how many candidates there are (more than max_ids: only the first max_ids are written), 0
 * when every token is masked (*floor_out is then -inf). */
long wkv_screen_candidates(const float *approx, const float *mask, const float *row_norm,
                           const float *error_norm, float row_weight, float error_weight, long n, long *ids,
                           long max_ids, float *floor_out)
{
    float floor = -INFINITY;
    long i = 0;
#if defined(__AVX512F__)
    const __m512 rw = _mm512_set1_ps(row_weight), ew = _mm512_set1_ps(error_weight);
    __m512 lows = _mm512_set1_ps(-INFINITY), masked;
    for (; i + 16 <= n; i += 16) {
        const __m512 bound = bounds16(approx, mask, row_norm, error_norm, rw, ew, i, &masked);
        lows = _mm512_max_ps(lows, _mm512_sub_ps(masked, bound));
    }
    floor = _mm512_reduce_max_ps(lows);
#endif
    for (; i < n; i++) {
        const float low = (approx[i] + mask[i]) - bound_of(row_norm, error_norm, row_weight, error_weight, i);
        floor = low > floor ? low : floor;
    }
    *floor_out = floor;
    if (floor == -INFINITY) return 0;
    long count = 0;
    i = 0;
#if defined(__AVX512F__)
    const __m512 floors = _mm512_set1_ps(floor);
    for (; i + 16 <= n; i += 16) {
        const __m512 bound = bounds16(approx, mask, row_norm, error_norm, rw, ew, i, &masked);
        unsigned hits = _mm512_cmp_ps_mask(_mm512_add_ps(masked, bound), floors, _CMP_GE_OQ);
        while (hits) { /* a few tokens a step */
            const int lane = __builtin_ctz(hits);
            if (count < max_ids) ids[count] = i + lane;
            count++;
            hits &= hits - 1;
        }
    }
#endif
    for (; i < n; i++)
        if ((approx[i] + mask[i]) + bound_of(row_norm, error_norm, row_weight, error_weight, i) >= floor) {
            if (count < max_ids) ids[count] = i;
            count++;
        }
    return count;
}

#pragma GCC pop_options
