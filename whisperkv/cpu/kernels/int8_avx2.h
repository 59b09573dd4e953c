/* The int8 rows kernel's products on a CPU with AVX2 but without AVX512-VNNI (an AMD Zen 3, an Intel
 * before Ice Lake): included by int8_rows.c, which takes it only where VNNI's path is not built.
 *
 * Why not vpmaddubsw (AVX2's own byte products, what fbgemm uses): it adds two u8 x s8 products into 16
 * bits and saturates, and a row quantised over its full 8-bit range (255) times a weight of 127, twice,
 * is 64,770 > 32,767. fbgemm gives up a bit of the row's range for it (``reduce_range``); the kernel's
 * rows are quantised as VNNI's are, so here both sides are widened to 16 bits and multiplied by
 * vpmaddwd (pairs into 32 bits, exact): the same integer sums as VNNI's, so the same bits (tested
 * against the plain C loops and the library in use, tests/test_int8_rows.py).
 *
 * A weight line (16 outputs x 4 inputs, 64 bytes) is widened once into four registers (4 outputs x 4
 * inputs each) for the rows of a pass; each row's 4 inputs are widened and repeated 4 times. A row's
 * four accumulators hold 2 partial sums per output, added pairwise once at the end. That is for a
 * step's few rows; calls of WIDE_MIN_ROWS rows or more widen each weight block and each row once
 * (``avx2_wide_sums``, below), since re-widening a line for every two rows held those at about half the
 * products an instruction the widened layout reaches. */
#ifndef WKV_INT8_AVX2_H
#define WKV_INT8_AVX2_H
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AVX2_GROUP 2 /* rows a pass: 2 x 4 accumulators + 4 weight registers + 2 rows of 16 */

/* G <= AVX2_GROUP rows (``stride`` bytes apart) through one weight block [in/4][16][4]: sums[r][lane]. */
static inline __attribute__((always_inline)) void avx2_group_sums(const uint8_t *xq, long stride, long in,
                                                                  const int8_t *block, int32_t sums[][16],
                                                                  const int G)
{
    __m256i acc[AVX2_GROUP][4];
    for (int r = 0; r < G; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm256_setzero_si256();
    for (long k = 0; k < in / 4; k++) {
        const int8_t *line = block + k * 64;
        __m256i w[4];
        for (int j = 0; j < 4; j++) w[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(line + 16 * j)));
        for (int r = 0; r < G; r++) {
            int32_t four;
            memcpy(&four, xq + r * stride + 4 * k, 4);
            const __m256i x = _mm256_cvtepu8_epi16(_mm_set1_epi32(four));
            for (int j = 0; j < 4; j++) acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(w[j], x));
        }
    }
    /* acc[j] = [o0 o0 o1 o1 | o2 o2 o3 o3] of outputs 4j..4j+3; hadd of two: [a0 a1 b0 b1 | a2 a3 b2 b3] */
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int r = 0; r < G; r++) {
        const __m256i low = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(acc[r][0], acc[r][1]), order);
        const __m256i high = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(acc[r][2], acc[r][3]), order);
        _mm256_storeu_si256((__m256i *)sums[r], low);
        _mm256_storeu_si256((__m256i *)(sums[r] + 8), high);
    }
}

/* The int32 sums of n quantised rows with one weight block, AVX2_GROUP rows a pass. */
static void avx2_block_sums(const uint8_t *xq, long stride, long n, long in, const int8_t *block,
                            int32_t sums[][16])
{
    long r = 0;
    for (; r + AVX2_GROUP <= n; r += AVX2_GROUP)
        avx2_group_sums(xq + r * stride, stride, in, block, sums + r, AVX2_GROUP);
    if (r < n) avx2_group_sums(xq + r * stride, stride, in, block, sums + r, 1);
}

/* Eight rows or more (a Cross-KV projection's 1,500, a prompt's, a batch of windows' steps): each
 * weight block is widened to 16 bits once per call, [in/2][16 outputs][2 inputs], and each row once,
 * so the inner loop is one load of a row's input pair and two vpmaddwd + two vpaddd a row for
 * WIDE_GROUP rows, nothing widened or added across a register in it. The same integer sums as above
 * (exact 16-bit products), so the same bits. */
#ifndef WIDE_MIN_ROWS /* a build may set it (tests/test_int8_rows.py builds the pairs alone with it) */
#define WIDE_MIN_ROWS 8 /* fewer rows (a greedy or beam-5 step): the pairs above, nothing widened per call */
#endif
#define WIDE_GROUP 5  /* rows a pass: 5 x 2 accumulators + 2 weight registers + 1 input pair + 2 products */
#define WIDE_CHUNK 45 /* rows whose sums a pass over a block keeps (asserted <= 16 * AMX_GROUPS in int8_rows.c) */

/* Rows quantised to bytes [R, in] as int16, or NULL where they cannot be allocated. */
static int16_t *avx2_widened_rows(const uint8_t *xq, long R, long in)
{
    int16_t *xw = malloc(sizeof(int16_t) * (size_t)(R * in));
    if (xw)
#pragma omp parallel for schedule(static) if (R >= 64) /* PARALLEL_ROWS, as the rows were quantised */
        for (long r = 0; r < R; r++)
            for (long i = 0; i < in; i++) xw[r * in + i] = xq[r * in + i];
    return xw;
}

/* A packed block [in/4][16][4] int8 into [in/2][16][2] int16: each quarter line (4 outputs x 4 inputs)
 * split into its outputs' first and second input pairs, each widened. */
static void avx2_widen_block(const int8_t *block, long in, int16_t *wide)
{
    const __m128i pairs = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    for (long k = 0; k < in / 4; k++)
        for (int q = 0; q < 4; q++) {
            const __m128i split = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(block + k * 64 + 16 * q)), pairs);
            _mm_storeu_si128((__m128i *)(wide + 64 * k + 8 * q), _mm_cvtepi8_epi16(split));
            _mm_storeu_si128((__m128i *)(wide + 64 * k + 32 + 8 * q), _mm_cvtepi8_epi16(_mm_srli_si128(split, 8)));
        }
}

/* G <= WIDE_GROUP widened rows (``in`` int16 apart) through one widened block: sums[r][lane]. */
static inline __attribute__((always_inline)) void avx2_wide_group(const int16_t *xw, long in, const int16_t *wide,
                                                                  int32_t sums[][16], const int G)
{
    __m256i acc[WIDE_GROUP][2];
    for (int r = 0; r < G; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (long k = 0; k < in / 2; k++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wide + 32 * k));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wide + 32 * k + 16));
        for (int r = 0; r < G; r++) {
            int32_t pair;
            memcpy(&pair, xw + r * in + 2 * k, 4);
            const __m256i x = _mm256_set1_epi32(pair);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(w0, x));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(w1, x));
        }
    }
    for (int r = 0; r < G; r++) {
        _mm256_storeu_si256((__m256i *)sums[r], acc[r][0]);
        _mm256_storeu_si256((__m256i *)(sums[r] + 8), acc[r][1]);
    }
}

/* The int32 sums of n widened rows with one widened block, WIDE_GROUP rows a pass. */
static void avx2_wide_sums(const int16_t *xw, long in, long n, const int16_t *wide, int32_t sums[][16])
{
    long r = 0;
    for (; r + WIDE_GROUP <= n; r += WIDE_GROUP) avx2_wide_group(xw + r * in, in, wide, sums + r, WIDE_GROUP);
    switch (n - r) {
    case 1: avx2_wide_group(xw + r * in, in, wide, sums + r, 1); break;
    case 2: avx2_wide_group(xw + r * in, in, wide, sums + r, 2); break;
    case 3: avx2_wide_group(xw + r * in, in, wide, sums + r, 3); break;
    case 4: avx2_wide_group(xw + r * in, in, wide, sums + r, 4); break;
    default: break;
    }
}
#endif
