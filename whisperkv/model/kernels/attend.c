/* Few-query attention over cached keys and values: one decoder step of the int8 compute type.
 *
 * A decoder step asks, per window and head, for 1-16 query rows (one per beam) against up to 1,500
 * cached key/value rows. PyTorch's scaled_dot_product_attention runs this through its blocked flash
 * kernel, which is built for long queries; here each (window, head) is one pass over its keys and one
 * over its values, every query row at once, so the cache is read once per step.
 *
 * Each (window, head) is computed by one thread in a fixed order: a row's numbers depend neither on
 * the other windows in the call nor on the thread count. Built by model/attend_kernel.py.
 *
 * Two versions: caches held in float32 (wkv_attend) and in bfloat16 (wkv_attend_bf16, the int8
 * type's caches: half the bytes read per step). A bfloat16 is the top half of a float32, so each
 * cached row is widened once, exactly, into 64 floats on the stack, then read by every query row. */
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* q: rows (b * Q + j) at q + row * q_row, head h at column h * HEAD (B windows of Q rows, H heads).
 * k, v: [B, H, T, HEAD] with strides in elements (b, h, t) and unit stride within a row.
 * out: contiguous [B * Q, H * HEAD]. Returns 0, or 1 when Q or T is out of range (nothing written). */
#define WKV_ATTEND(NAME, KV, WIDEN)                                                                        \
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
            for (long t = 0; t < T; t++) {                                                                 \
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
            for (long t = 0; t < T; t++) {                                                                 \
                WIDEN(values + t * vt, row);                                                               \
                for (long j = 0; j < Q; j++) {                                                             \
                    const float p = scores[j * T + t];                                                     \
                    for (int d = 0; d < HEAD; d++) acc[j][d] += p * row[d];                                \
                }                                                                                          \
            }                                                                                              \
            for (long j = 0; j < Q; j++)                                                                   \
                memcpy(out + ((b * Q + j) * H + h) * HEAD, acc[j], sizeof(float) * HEAD);                  \
        }                                                                                                  \
        return 0;                                                                                          \
    }

WKV_ATTEND(wkv_attend, float, widen_f32)
WKV_ATTEND(wkv_attend_bf16, uint16_t, widen_bf16)
