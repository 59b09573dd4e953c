/* The int8 type's bfloat16 encoder self-attention through AMX's bfloat16 tiles (tdpbf16ps).
 *
 * A window's self-attention is 1,500 queries x 1,500 keys per head. PyTorch's SDPA (its CPU flash
 * kernel) took ~10 ms a layer here for tiny.en's six heads: 40 % of the int8 type's encoder. Here each
 * head's keys and values of each window are packed once into the tiles' pair layout, then threads take
 * 128 queries of one head at a time. For each block of 16 queries, the 16 x T scores come from two tile
 * products per 16 keys, the softmax runs over the whole row in float32 (AVX-512, the exponent by a
 * degree-5 polynomial), the probabilities are rounded to bfloat16 (as SDPA's bfloat16 path rounds them
 * before its product with the values) and multiply the values in tiles; each output row is divided by
 * its sum and written straight into [window, position, head x 64], the output projection's input, with
 * no transpose. The numbers are not SDPA's bits (other sum orders, another exponent): the twin is SDPA,
 * tested close against a float32 reference, and the int8 type's words are measured (benchmarks/bench.py).
 * Built by cpu/build.py into the kernels' library. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "avx512_math.h"

#if defined(WKV_AMX_TILES) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define WKV_AMX_BF16 1
#endif

#define WIDTH 64     /* every Whisper model's head width */
#define TILE 512     /* bfloat16 elements in one 16 x 64-byte tile */
#define CHUNK 8      /* query blocks of 16 a thread takes at a time */

#ifdef WKV_AMX_BF16
/* Keys [T][64] (``stride`` elements apart) into tiles [T16/16][2][16 pairs][16 keys][2]: tile (block,
 * half) is the B operand of the scores of 16 keys over 32 of the width. Keys past T are 0. */
static void pack_keys(const uint16_t *k, long stride, long T, long T16, uint16_t *packed)
{
    for (long block = 0; block < T16 / 16; block++)
        for (int half = 0; half < 2; half++) {
            uint32_t *tile = (uint32_t *)(packed + (block * 2 + half) * TILE);
            for (int n = 0; n < 16; n++) {
                const long key = block * 16 + n;
                const uint32_t *pairs = (const uint32_t *)(k + key * stride + half * 32);
                for (int pair = 0; pair < 16; pair++) tile[pair * 16 + n] = key < T ? pairs[pair] : 0;
            }
        }
}

/* Values [T][64] into tiles [T32/32][4][16 key pairs][16 columns][2]: tile (chunk, group) is the B
 * operand of 32 keys' probabilities times 16 of the width. Keys past T are 0. */
static void pack_values(const uint16_t *v, long stride, long T, long T32, uint16_t *packed)
{
    for (long chunk = 0; chunk < T32 / 32; chunk++)
        for (int group = 0; group < 4; group++) {
            uint16_t *tile = packed + (chunk * 4 + group) * TILE;
            for (int pair = 0; pair < 16; pair++)
                for (int j = 0; j < 2; j++) {
                    const long key = chunk * 32 + pair * 2 + j;
                    for (int n = 0; n < 16; n++)
                        tile[pair * 32 + n * 2 + j] = key < T ? v[key * stride + group * 16 + n] : 0;
                }
        }
}

/* One row of scores (T floats): its probabilities exp(scale (s - max)) rounded to bfloat16 into ``p``
 * at p[t / 32 * 512 + t % 32] (the tiles' layout: row r of a block of 16 starts at p + 32 r), zeros
 * from T to T32; returns 1 / their float32 sum. Four running maxima and sums: no chain of dependent
 * additions through the row. */
static float softmax_row(const float *s, long T, long T32, float log2_scale, uint16_t *p)
{
    __m512 top[4];
    for (int i = 0; i < 4; i++) top[i] = _mm512_set1_ps(-FLT_MAX);
    long t = 0;
    for (; t + 64 <= T; t += 64)
        for (int i = 0; i < 4; i++) top[i] = _mm512_max_ps(top[i], _mm512_loadu_ps(s + t + 16 * i));
    for (; t + 16 <= T; t += 16) top[0] = _mm512_max_ps(top[0], _mm512_loadu_ps(s + t));
    const __mmask16 tail = (__mmask16)((1u << (T - t)) - 1);
    if (t < T) top[1] = _mm512_mask_max_ps(top[1], tail, top[1], _mm512_maskz_loadu_ps(tail, s + t));
    const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(top[0], top[1]), _mm512_max_ps(top[2], top[3])));
    const __m512 shift = _mm512_set1_ps(largest * log2_scale), factor = _mm512_set1_ps(log2_scale);
    __m512 sum[4];
    for (int i = 0; i < 4; i++) sum[i] = _mm512_setzero_ps();
#define AT(t) (p + (t) / 32 * 512 + (t) % 32)
    for (t = 0; t + 64 <= T; t += 64)
        for (int i = 0; i < 4; i++) {
            const __m512 e = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(s + t + 16 * i), factor, shift));
            sum[i] = _mm512_add_ps(sum[i], e);
            _mm256_storeu_si256((__m256i *)AT(t + 16 * i), (__m256i)_mm512_cvtneps_pbh(e));
        }
    for (; t + 16 <= T; t += 16) {
        const __m512 e = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(s + t), factor, shift));
        sum[0] = _mm512_add_ps(sum[0], e);
        _mm256_storeu_si256((__m256i *)AT(t), (__m256i)_mm512_cvtneps_pbh(e));
    }
    if (t < T) {
        const __m512 x = _mm512_maskz_loadu_ps(tail, s + t);
        const __m512 e = _mm512_maskz_mov_ps(tail, exp2_nonpositive(_mm512_fmsub_ps(x, factor, shift)));
        sum[1] = _mm512_add_ps(sum[1], e);
        _mm256_storeu_si256((__m256i *)AT(t), (__m256i)_mm512_cvtneps_pbh(e));
        t += 16;
    }
    for (; t < T32; t += 16) _mm256_storeu_si256((__m256i *)AT(t), _mm256_setzero_si256());
#undef AT
    return 1.0f / _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3])));
}

/* The 16 queries from row m0 on (zeros past T) into ``queries`` and tiles 4 (the width's first 32) and 5
 * (its last 32). */
static inline void load_queries(const uint16_t *q, long stride, long T, long m0, uint16_t *queries)
{
    const long rows = T - m0 < 16 ? T - m0 : 16;
    for (long r = 0; r < 16; r++) {
        if (r < rows) memcpy(queries + r * WIDTH, q + (m0 + r) * stride, WIDTH * 2);
        else memset(queries + r * WIDTH, 0, WIDTH * 2);
    }
    _tile_loadd(4, queries, WIDTH * 2);
    _tile_loadd(5, queries + 32, WIDTH * 2);
}

/* The scores of the queries in tiles 4 and 5 with 16 keys (key block b) into tile t, stored to row block b
 * of ``s`` (rows T16 floats apart). Tile numbers must be constants: a macro. */
#define SCORES(t, b, s)                                                                                  \
    do {                                                                                                 \
        _tile_zero(t);                                                                                   \
        _tile_loadd(6, kp + (b) * 2 * TILE, 64);                                                         \
        _tile_dpbf16ps(t, 4, 6);                                                                         \
        _tile_loadd(7, kp + ((b) * 2 + 1) * TILE, 64);                                                   \
        _tile_dpbf16ps(t, 5, 7);                                                                         \
        _tile_stored(t, (s) + (b) * 16, T16 * 4);                                                        \
    } while (0)

/* Key blocks [from, until) of the scores of the queries in tiles 4 and 5 into ``s``: two accumulators
 * alternate, so one's products run while the other's are stored. */
static inline void score_blocks(const uint16_t *kp, long T16, long from, long until, float *s)
{
    long block = from;
    for (; block + 2 <= until; block += 2) {
        SCORES(0, block, s);
        SCORES(1, block + 1, s);
    }
    if (block < until) SCORES(0, block, s);
}
#undef SCORES

/* Query blocks [first, last) of one head of one window: queries [T][64] ``stride`` elements apart, keys
 * and values packed (kp: T16 x 64, vp: T32 x 64); out [T][64] ``out_stride`` apart. Buffers: s (two
 * blocks' scores, 2 x 16 x T16 floats), p (16 x T32, in tiles).
 *
 * A block's scores are made (tiles) while the block before it goes through its softmax (the vector
 * unit): a share of the next block's key blocks is issued before each softmax row, so the out-of-order
 * core runs the two side by side; then the block's probabilities times the values (tiles). Each block's
 * numbers are the same operations in the same order as one block at a time: the same bits. Scratch (one
 * layer, 1,500 positions, 2 threads): tiny.en's 3.39-3.49 -> 3.20-3.32 ms, large-v3-turbo's 11.5-11.6 ->
 * 10.9-11.3 ms; issuing them among a row's exponents instead gained no more. */
static void attend_blocks(const uint16_t *q, long stride, long T, long first, long last, const uint16_t *kp,
                          const uint16_t *vp, float log2_scale, uint16_t *out, long out_stride, float *s,
                          uint16_t *p)
{
    const long T16 = (T + 15) / 16 * 16, T32 = (T + 31) / 32 * 32, keys = T16 / 16;
    const long end = last * 16 < T ? last * 16 : T;
    uint16_t queries[16 * WIDTH] __attribute__((aligned(64)));
    float sums[16 * WIDTH] __attribute__((aligned(64)));
    float inverse[16];
    if (first * 16 >= end) return;
    load_queries(q, stride, T, first * 16, queries);
    score_blocks(kp, T16, 0, keys, s);
    for (long m0 = first * 16, turn = 0; m0 < end; m0 += 16, turn ^= 1) {
        const long rows = T - m0 < 16 ? T - m0 : 16, next = m0 + 16 < end;
        float *now = s + turn * 16 * T16, *after = s + (turn ^ 1) * 16 * T16;
        if (next) load_queries(q, stride, T, m0 + 16, queries);
        for (long r = 0, done = 0; r < 16; r++) {
            if (next) { /* the next block's share of key blocks, issued ahead of this row's softmax */
                const long until = (r + 1) * keys / 16;
                score_blocks(kp, T16, done, until, after);
                done = until;
            }
            inverse[r] = softmax_row(now + r * T16, T, T32, log2_scale, p + r * 32);
        }
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long chunk = 0; chunk < T32 / 32; chunk++) {
            _tile_loadd(4, p + chunk * TILE, 64);
            _tile_loadd(6, vp + (chunk * 4 + 0) * TILE, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, vp + (chunk * 4 + 1) * TILE, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(6, vp + (chunk * 4 + 2) * TILE, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_loadd(7, vp + (chunk * 4 + 3) * TILE, 64);
            _tile_dpbf16ps(3, 4, 7);
        }
        _tile_stored(0, sums, WIDTH * 4); /* tile numbers are constants: no loop */
        _tile_stored(1, sums + 16, WIDTH * 4);
        _tile_stored(2, sums + 32, WIDTH * 4);
        _tile_stored(3, sums + 48, WIDTH * 4);
        for (long r = 0; r < rows; r++) {
            const __m512 scale = _mm512_set1_ps(inverse[r]);
            for (int c = 0; c < WIDTH; c += 16) {
                const __m512 o = _mm512_mul_ps(_mm512_load_ps(sums + r * WIDTH + c), scale);
                _mm256_storeu_si256((__m256i *)(out + (m0 + r) * out_stride + c), (__m256i)_mm512_cvtneps_pbh(o));
            }
        }
    }
}
#endif

/* Whether this build and this process can run wkv_encoder_attend_bf16. */
int wkv_encoder_attend_available(void)
{
#ifdef WKV_AMX_BF16
    return amx_permitted();
#else
    return 0;
#endif
}

/* Self-attention of ``windows`` x ``heads`` heads, bfloat16: element (window w, position t, head h,
 * column d) of the queries, keys and values at w * window_stride + t * stride + h * 64 + d (three views
 * of one fused projection, say); ``out`` [windows][T][heads * 64]. ``scale`` multiplies the scores
 * (1/8 in Whisper). Returns 0 without touching ``out`` where this build or process has no AMX. */
int wkv_encoder_attend_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, long window_stride,
                            long stride, long windows, long heads, long T, float scale, uint16_t *out)
{
#ifdef WKV_AMX_BF16
    if (!amx_permitted() || T < 1) return 0;
    const long T16 = (T + 15) / 16 * 16, T32 = (T + 31) / 32 * 32, heads_all = windows * heads;
    const long packed = (T16 + T32) * WIDTH; /* one head's keys and values */
    const long chunks = (T16 / 16 + CHUNK - 1) / CHUNK;
    const float log2_scale = scale * 1.4426950408889634f;
    uint16_t *kv = aligned_alloc(64, (size_t)(heads_all * packed * 2));
    if (!kv) return -1;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (long job = 0; job < heads_all; job++) {
            const long at = job / heads * window_stride + job % heads * WIDTH;
            pack_keys(k + at, stride, T, T16, kv + job * packed);
            pack_values(v + at, stride, T, T32, kv + job * packed + T16 * WIDTH);
        }
        float *s = aligned_alloc(64, (size_t)2 * 16 * T16 * 4); /* two blocks' scores: see attend_blocks */
        uint16_t *p = aligned_alloc(64, (size_t)16 * T32 * 2);
        if (!s || !p) failed = 1;
        else amx_configure();
        /* query blocks in chunks, handed out as threads come free: a thread the system delays (a server's
         * request threads share the cores) leaves its share to the others */
#pragma omp for schedule(dynamic)
        for (long item = 0; item < heads_all * chunks; item++) {
            if (failed) continue;
            const long job = item / chunks, chunk = item % chunks, w = job / heads, h = job % heads;
            attend_blocks(q + w * window_stride + h * WIDTH, stride, T, chunk * CHUNK, (chunk + 1) * CHUNK,
                          kv + job * packed, kv + job * packed + T16 * WIDTH, log2_scale,
                          out + w * T * heads * WIDTH + h * WIDTH, heads * WIDTH, s, p);
        }
        if (!failed) _tile_release();
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
