/* The k largest values of each row of a float32 matrix, in descending order, with their indices: what
 * beam search asks of every step's log-probabilities (beam size + 1 per row, 51,864 columns).
 *
 * torch.topk copies each row into (value, index) pairs and partially sorts them: about 33 us a row
 * here. This reads each row once, 16 values at a time, and only looks closer at a block holding a
 * value above the current k-th largest: most blocks are passed over by one vector compare.
 *
 * Values compare through integer keys (a float's bits, negative ones' magnitude bits flipped), so the
 * comparisons stay exact under -ffast-math: -0.0 keys as +0.0, any NaN as the largest (torch.topk's
 * order). It keeps k + 1 candidates, earlier indices first among equal keys. Where two of them are
 * equal, the order torch.topk gives is not determined by the values alone, so the row is flagged
 * (tied[row] = 1) and the caller asks torch.topk for it; every other row's top k is the only one there
 * is, and so torch.topk's exactly. Rows run one per thread: a row's result depends on nothing else.
 * Built with the other kernels by cpu/build.py. */
#include <stdint.h>
#include <string.h>

#define MAXK 64 /* candidates kept per row (k + 1) */
#define BLOCK 16

static inline int32_t order_key(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint32_t magnitude = bits & 0x7fffffffu;
    int32_t key = (int32_t)(bits ^ ((uint32_t)((int32_t)bits >> 31) & 0x7fffffffu));
    key = magnitude == 0 ? 0 : key;                  /* -0.0 equals +0.0 */
    return magnitude > 0x7f800000u ? INT32_MAX : key; /* NaN: the largest */
}

/* Whether any of the BLOCK values at x has a key above floor: one or two vector compares. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline int block_beats(const float *x, int32_t floor)
{
    const __m512i low31 = _mm512_set1_epi32(0x7fffffff);
    __m512i bits = _mm512_loadu_si512((const void *)x);
    __m512i magnitude = _mm512_and_si512(bits, low31);
    __m512i key = _mm512_xor_si512(bits, _mm512_and_si512(_mm512_srai_epi32(bits, 31), low31));
    key = _mm512_mask_mov_epi32(key, _mm512_cmpeq_epi32_mask(magnitude, _mm512_setzero_si512()),
                                _mm512_setzero_si512());
    key = _mm512_mask_mov_epi32(key, _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000)),
                                _mm512_set1_epi32(INT32_MAX));
    return _mm512_cmpgt_epi32_mask(key, _mm512_set1_epi32(floor)) != 0;
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline int block_beats(const float *x, int32_t floor)
{
    const __m256i low31 = _mm256_set1_epi32(0x7fffffff);
    int any = 0;
    for (int half = 0; half < BLOCK; half += 8) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(x + half));
        __m256i magnitude = _mm256_and_si256(bits, low31);
        __m256i key = _mm256_xor_si256(bits, _mm256_and_si256(_mm256_srai_epi32(bits, 31), low31));
        key = _mm256_andnot_si256(_mm256_cmpeq_epi32(magnitude, _mm256_setzero_si256()), key);
        __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
        key = _mm256_blendv_epi8(key, _mm256_set1_epi32(INT32_MAX), nan);
        any |= _mm256_movemask_epi8(_mm256_cmpgt_epi32(key, _mm256_set1_epi32(floor)));
    }
    return any != 0;
}
#else
static inline int block_beats(const float *x, int32_t floor)
{
    int any = 0;
    for (int t = 0; t < BLOCK; t++) any |= order_key(x[t]) > floor;
    return any;
}
#endif

/* Insert (key, index) into keys/indices (count held, at most keep, sorted descending, earlier index
 * first among equals); returns the new count. */
static inline int insert(int32_t *keys, long *indices, int count, int keep, int32_t key, long index)
{
    int at = count < keep ? count : keep - 1;
    while (at > 0 && keys[at - 1] < key) {
        keys[at] = keys[at - 1];
        indices[at] = indices[at - 1];
        at--;
    }
    keys[at] = key;
    indices[at] = index;
    return count < keep ? count + 1 : count;
}

static int row_top(const float *x, long n, int keep, int32_t *keys, long *indices)
{
    int count = 0;
    int32_t floor = INT32_MIN; /* a value must beat this to enter: nothing, until keep are held */
    long j = 0;
    for (; j + BLOCK <= n; j += BLOCK) {
        if (count == keep && !block_beats(x + j, floor)) continue;
        for (int t = 0; t < BLOCK; t++) {
            int32_t key = order_key(x[j + t]);
            if (count < keep || key > floor) {
                count = insert(keys, indices, count, keep, key, j + t);
                if (count == keep) floor = keys[keep - 1];
            }
        }
    }
    for (; j < n; j++) {
        int32_t key = order_key(x[j]);
        if (count < keep || key > floor) {
            count = insert(keys, indices, count, keep, key, j);
            if (count == keep) floor = keys[keep - 1];
        }
    }
    return count;
}

/* values/indices [rows, k] (row-major), tied [rows]; x's rows start row_stride floats apart.
 * Returns 0, or -1 when k is out of range (nothing written). */
int wkv_top_k(const float *x, long rows, long n, long row_stride, long k, float *values, long *indices,
              int32_t *tied)
{
    if (k < 1 || k + 1 > MAXK) return -1;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        int32_t keys[MAXK];
        long found[MAXK];
        const float *row = x + r * row_stride;
        int keep = (int)k + 1;
        int count = row_top(row, n, keep, keys, found);
        int tie = count < keep; /* fewer than k + 1 values: let torch.topk say what it does */
        for (int t = 0; t + 1 < count; t++) tie |= keys[t] == keys[t + 1];
        tied[r] = tie;
        for (long t = 0; t < k; t++) {
            long at = t < count ? found[t] : 0;
            values[r * k + t] = row[at];
            indices[r * k + t] = at;
        }
    }
    return 0;
}
