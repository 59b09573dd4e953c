/* One float32 decoder block's step for the rows of one cache, in one call from Python.
 *
 * A step of tiny.en went through 8 C calls per block from Python (six linears, two attentions: 32 a
 * step) plus the Python around them (allocating outputs, taking views, writing the new keys and values
 * into the Self-KV). Here one call per block makes the same calls, in the same order, on the same
 * inputs: every number is the one the call-by-call path gives (it is the same code), and the Python
 * between them is gone. cpu/block_step.py (BlockStep) decides when it applies: one cache's rows, one
 * new position each, float16-held weights (both bundled models), float32 caches.
 * Built by cpu/build.py with the other kernels. */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t half; /* float16 bits */

int wkv_rows_f32_half(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,
                      float *scratch, const half *w, const float *bias, long out, long in, int do_gelu,
                      const float *residual, long rs, float *y, long ys);
int wkv_attend(const float *q, long q_row, const float *k, const float *v, float *out, long B, long Q, long H,
               long T, long kb, long kh, long kt, long vb, long vh, long vt, float scale);

/* One block's parameters, as the model holds them (set once per block by cpu/step_rows.py). */
struct wkv_block {
    const float *attn_ln_w, *attn_ln_b, *cross_ln_w, *cross_ln_b, *mlp_ln_w, *mlp_ln_b;
    float attn_ln_eps, cross_ln_eps, mlp_ln_eps;
    const half *qkv_w, *out_w, *query_w, *cross_out_w, *up_w, *down_w;
    const float *qkv_b, *out_b, *query_b, *cross_out_b, *up_b, *down_b;
    long d, hidden, heads;
};

/* x [n, d] (contiguous) → the block's output, in place.
 * self_k/self_v: the Self-KV [n, H, capacity, 64] (strides sb, sh, st in elements); its first `length`
 * positions are held, the new position is written at `length` (the caller counts it).
 * cross_k/cross_v: the window's Cross-KV [cb_rows, H, T, 64] (strides cb, ch, ct), n a multiple of cb_rows.
 * Row r is cache row r's next position.
 * work: n * (6 d + hidden) floats. Returns 0, or the failing call's code (1): the caller checks shapes. */
int wkv_block_step(const struct wkv_block *p, float *x, long n, float *self_k, float *self_v, long length,
                   long sb, long sh, long st, const float *cross_k, const float *cross_v, long cb_rows, long T,
                   long cb, long ch, long ct, float *work, float scale)
{
    const long d = p->d, H = p->heads, head = d / H;
    float *qkv = work, *attended = qkv + n * 3 * d, *query = attended + n * d, *normed = query + n * d;
    float *hidden = normed + n * d;
    int failed = wkv_rows_f32_half(x, n, d, p->attn_ln_w, p->attn_ln_b, p->attn_ln_eps, normed, p->qkv_w,
                                   p->qkv_b, 3 * d, d, 0, NULL, 0, qkv, 3 * d);
    if (failed) return failed;
    for (long r = 0; r < n; r++) /* the new keys and values, head by head, into the Self-KV */
        for (long h = 0; h < H; h++) {
            const float *row = qkv + r * 3 * d + h * head;
            memcpy(self_k + r * sb + h * sh + length * st, row + d, sizeof(float) * head);
            memcpy(self_v + r * sb + h * sh + length * st, row + 2 * d, sizeof(float) * head);
        }
    failed = wkv_attend(qkv, 3 * d, self_k, self_v, attended, n, 1, H, length + 1, sb, sh, st, sb, sh, st, scale);
    failed = failed || wkv_rows_f32_half(attended, n, d, NULL, NULL, 0.f, NULL, p->out_w, p->out_b, d, d, 0, x, d,
                                         x, d);
    failed = failed || wkv_rows_f32_half(x, n, d, p->cross_ln_w, p->cross_ln_b, p->cross_ln_eps, normed,
                                         p->query_w, p->query_b, d, d, 0, NULL, 0, query, d);
    failed = failed || wkv_attend(query, d, cross_k, cross_v, attended, cb_rows, n / cb_rows, H, T, cb, ch, ct, cb,
                                  ch, ct, scale);
    failed = failed || wkv_rows_f32_half(attended, n, d, NULL, NULL, 0.f, NULL, p->cross_out_w, p->cross_out_b,
                                         d, d, 0, x, d, x, d);
    failed = failed || wkv_rows_f32_half(x, n, d, p->mlp_ln_w, p->mlp_ln_b, p->mlp_ln_eps, normed, p->up_w,
                                         p->up_b, p->hidden, d, 1, NULL, 0, hidden, p->hidden);
    failed = failed || wkv_rows_f32_half(hidden, n, p->hidden, NULL, NULL, 0.f, NULL, p->down_w, p->down_b, d,
                                         p->hidden, 0, x, d, x, d);
    return failed;
}

/* A whole decoder's parameters for wkv_decoder_step (set once per model by cpu/decoder_step.py). */
struct wkv_decoder {
    const struct wkv_block *const *blocks; /* [layers] */
    long layers;
    const half *table;      /* the tied token table [vocab, d], float16 values (step_rows.half_copy) */
    long vocab;
    const float *positions; /* the positional embedding [n_ctx, d] */
    long n_ctx;
    const float *ln_w, *ln_b; /* the final LayerNorm */
    float ln_eps;
};

/* float16 bits → float32, exactly (every float16 is a float32) */
static float widen_half(half h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) bits = sign | 0x7f800000u | (mantissa << 13); /* infinities, NaNs */
    else if (exponent) bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else { /* zero or subnormal: mantissa × 2^-24, exact in float32 */
        const float magnitude = ldexpf((float)mantissa, -24);
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* For a test: count float16 values widened into out. */
void wkv_widen_half(const half *in, long count, float *out)
{
    for (long i = 0; i < count; i++) out[i] = widen_half(in[i]);
}

/* One greedy or beam step of the whole decoder for the n rows of ONE cache, every row at `position`:
 * embed tokens[n] (table row widened + positional row: torch.add's one float32 addition), every block
 * (block_step above: the same calls as wkv_block_step), the final LayerNorm and the vocabulary product
 * (wkv_rows_f32_half with the table: what the projection's kernel call with the LayerNorm computes) into
 * logits [n, vocab]. Layer l's caches: self_k[l], self_v[l] (strides sb, sh, st; `length` positions held,
 * the new one written at `length`: the caller counts it) and cross_k[l], cross_v[l] (cb_rows rows, T
 * positions, strides cb, ch, ct): every layer's caches have the same shapes and strides.
 * x: n * d floats; work: n * (6 d + hidden) floats, at least n * d.
 * Returns 0; 2 for a position past the table, 3 for a token outside the vocabulary (nothing written);
 * else the failing call's code (the caller checks the shapes first). */
int wkv_decoder_step(const struct wkv_decoder *p, const long *tokens, long n, long position, float *const *self_k,
                     float *const *self_v, long length, long sb, long sh, long st, const float *const *cross_k,
                     const float *const *cross_v, long cb_rows, long T, long cb, long ch, long ct, float *x,
                     float *work, float *logits, float scale)
{
    if (p->layers < 1) return 1;
    const long d = p->blocks[0]->d;
    if (position < 0 || position >= p->n_ctx) return 2;
    for (long r = 0; r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= p->vocab) return 3;
    for (long r = 0; r < n; r++)
        for (long k = 0; k < d; k++)
            x[r * d + k] = widen_half(p->table[tokens[r] * d + k]) + p->positions[position * d + k];
    for (long l = 0; l < p->layers; l++) {
        const int failed = wkv_block_step(p->blocks[l], x, n, self_k[l], self_v[l], length, sb, sh, st,
                                          cross_k[l], cross_v[l], cb_rows, T, cb, ch, ct, work, scale);
        if (failed) return failed;
    }
    return wkv_rows_f32_half(x, n, d, p->ln_w, p->ln_b, p->ln_eps, work, p->table, NULL, p->vocab, d, 0, NULL, 0,
                             logits, p->vocab);
}
