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
 * four accumulators hold 2 partial sums per output, added pairwise once at the end. */
#ifndef WKV_INT8_AVX2_H
#define WKV_INT8_AVX2_H
#include <immintrin.h>
#include <stdint.h>
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
#endif
