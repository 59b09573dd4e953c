/* One int8 decoder block's step for the rows of one cache, in one call from Python.
 *
 * The int8 type's step went through 6 int8 products and 2 attentions per block, with PyTorch between
 * them (LayerNorms, GELU, residual adds, splitting heads, writing bfloat16 keys and values into the
 * Self-KV): profile_step.py --compute_type int8 measured 2.15 of a 3.85 ms step outside the kernels.
 * Here one call per block makes the calls the call-by-call path makes (cpu/int8_step.py: each
 * linear with its LayerNorm, bias, GELU and residual through wkv_int8_rows_step), in the same order, on
 * the same inputs: every number is that path's, bit for bit (tested), and the Python between them is
 * gone. The new keys and values are rounded to bfloat16 as PyTorch rounds them (to nearest, ties to
 * even). cpu/int8_step.py (Int8BlockStep) decides when it applies: one cache's rows, one new
 * position each, bfloat16 caches. Built by cpu/build.py with the other kernels. */
#include <stdint.h>
#include <string.h>

int wkv_int8_rows_step(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,
                       float *scratch, const int8_t *packed, const float *w_scale, const int32_t *w_sum,
                       const float *bias, long out, long in, int do_gelu, const float *residual, long rs, float *y,
                       long ys);
int wkv_attend_bf16(const float *q, long q_row, const uint16_t *k, const uint16_t *v, float *out, long B, long Q,
                    long H, long T, long kb, long kh, long kt, long vb, long vh, long vt, float scale);

/* One Int8Linear as the rows kernel holds it (cpu/quantize.py). */
struct wkv_int8_linear {
    const int8_t *packed;
    const float *scale;
    const int32_t *sum;
    const float *bias; /* or NULL */
};

/* One block's parameters (set once per block by cpu/int8_step.py). */
struct wkv_int8_block {
    const float *attn_ln_w, *attn_ln_b, *cross_ln_w, *cross_ln_b, *mlp_ln_w, *mlp_ln_b;
    float attn_ln_eps, cross_ln_eps, mlp_ln_eps;
    struct wkv_int8_linear qkv, out, query, cross_out, up, down;
    long d, hidden, heads;
};

/* A float32 as bfloat16, rounded to nearest, ties to even (PyTorch's rounding; a NaN as 0x7FC0).
 * Integer operations only: -ffast-math does not touch them. */
static inline uint16_t bfloat16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static int linear(const struct wkv_int8_linear *l, const float *x, long n, long in, long out, const float *ln_w,
                  const float *ln_b, float eps, float *scratch, int do_gelu, const float *residual, float *y)
{
    return wkv_int8_rows_step(x, n, in, ln_w, ln_b, eps, scratch, l->packed, l->scale, l->sum, l->bias, out, in,
                              do_gelu, residual, out, y, out);
}

/* x [n, d] (contiguous) → the block's output, in place.
 * self_k/self_v: the bfloat16 Self-KV [n, H, capacity, 64] (strides sb, sh, st in elements); its first
 * `length` positions are held, the new position is written at `length` (the caller counts it).
 * cross_k/cross_v: the window's bfloat16 Cross-KV [cb_rows, H, T, 64] (strides cb, ch, ct), n a multiple
 * of cb_rows. work: n * (6 d + hidden) floats. Returns 0, or the failing call's code. */
int wkv_int8_block_step(const struct wkv_int8_block *p, float *x, long n, uint16_t *self_k, uint16_t *self_v,
                        long length, long sb, long sh, long st, const uint16_t *cross_k, const uint16_t *cross_v,
                        long cb_rows, long T, long cb, long ch, long ct, float *work, float scale)
{
    const long d = p->d, H = p->heads, head = d / H;
    float *qkv = work, *attended = qkv + n * 3 * d, *query = attended + n * d, *normed = query + n * d;
    float *hidden = normed + n * d;
    int failed = linear(&p->qkv, x, n, d, 3 * d, p->attn_ln_w, p->attn_ln_b, p->attn_ln_eps, normed, 0, NULL, qkv);
    if (failed) return failed;
    for (long r = 0; r < n; r++) /* the new keys and values, head by head, into the Self-KV */
        for (long h = 0; h < H; h++) {
            const float *row = qkv + r * 3 * d + h * head;
            uint16_t *key = self_k + r * sb + h * sh + length * st, *value = self_v + r * sb + h * sh + length * st;
            for (long i = 0; i < head; i++) {
                key[i] = bfloat16(row[d + i]);
                value[i] = bfloat16(row[2 * d + i]);
            }
        }
    failed = wkv_attend_bf16(qkv, 3 * d, self_k, self_v, attended, n, 1, H, length + 1, sb, sh, st, sb, sh, st,
                             scale);
    failed = failed || linear(&p->out, attended, n, d, d, NULL, NULL, 0.f, NULL, 0, x, x);
    failed = failed || linear(&p->query, x, n, d, d, p->cross_ln_w, p->cross_ln_b, p->cross_ln_eps, normed, 0,
                              NULL, query);
    failed = failed || wkv_attend_bf16(query, d, cross_k, cross_v, attended, cb_rows, n / cb_rows, H, T, cb, ch,
                                       ct, cb, ch, ct, scale);
    failed = failed || linear(&p->cross_out, attended, n, d, d, NULL, NULL, 0.f, NULL, 0, x, x);
    failed = failed || linear(&p->up, x, n, d, p->hidden, p->mlp_ln_w, p->mlp_ln_b, p->mlp_ln_eps, normed, 1,
                              NULL, hidden);
    failed = failed || linear(&p->down, hidden, n, p->hidden, d, NULL, NULL, 0.f, NULL, 0, x, x);
    return failed;
}

/* The int8 type's whole decoder (set once per model by cpu/decoder_step.py, Int8DecoderStep). */
struct wkv_int8_decoder {
    const struct wkv_int8_block *const *blocks; /* [layers] */
    long layers;
    const int8_t *embedding;        /* the token table: the vocabulary's packed rows (wkv_int8_pack) */
    const float *embedding_scale;   /* and their scales [vocab] */
    long vocab;
    const float *positions;         /* the positional embedding [n_ctx, d] */
    long n_ctx;
    const float *ln_w, *ln_b;       /* the final LayerNorm */
    float ln_eps;
    struct wkv_int8_linear projection; /* the vocabulary [vocab, d], no bias */
};

/* Int8Embedding's lookup (int8 × its row's scale; row t's 4 inputs k..k+3 sit at line k / 4 of block
 * t / 16, lane t % 16) plus the position's row: PyTorch's two roundings, in its order (no fused
 * multiply-add). */
__attribute__((optimize("no-fast-math", "fp-contract=off"))) static void embed(const struct wkv_int8_decoder *p,
                                                                              const long *tokens, long n,
                                                                              long position, long d, float *x)
{
    for (long r = 0; r < n; r++) {
        const int8_t *lane = p->embedding + (tokens[r] / 16) * d * 16 + (tokens[r] % 16) * 4;
        const float scale = p->embedding_scale[tokens[r]], *at = p->positions + position * d;
        for (long k = 0; k < d; k++) {
            const float value = (float)lane[(k / 4) * 64 + k % 4] * scale;
            x[r * d + k] = value + at[k];
        }
    }
}

/* One step of the whole int8 decoder for the n rows of ONE cache, every row at `position`, as
 * wkv_decoder_step (block_step.c) is for float32: embed, every block (wkv_int8_block_step), then the
 * vocabulary with the final LayerNorm in its call (wkv_int8_rows_step, as Int8StepRows calls it) into
 * logits [n, vocab]. Caches: bfloat16, layer l's at self_k[l], self_v[l], cross_k[l], cross_v[l], every
 * layer's of the same shapes and strides. x: n * d floats; work: n * (6 d + hidden) floats.
 * Returns 0; 2 for a position past the table, 3 for a token outside the vocabulary (nothing written);
 * else the failing call's code. */
int wkv_int8_decoder_step(const struct wkv_int8_decoder *p, const long *tokens, long n, long position,
                          uint16_t *const *self_k, uint16_t *const *self_v, long length, long sb, long sh, long st,
                          const uint16_t *const *cross_k, const uint16_t *const *cross_v, long cb_rows, long T,
                          long cb, long ch, long ct, float *x, float *work, float *logits, float scale)
{
    if (p->layers < 1) return 1;
    const long d = p->blocks[0]->d;
    if (position < 0 || position >= p->n_ctx) return 2;
    for (long r = 0; r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= p->vocab) return 3;
    embed(p, tokens, n, position, d, x);
    for (long l = 0; l < p->layers; l++) {
        const int failed = wkv_int8_block_step(p->blocks[l], x, n, self_k[l], self_v[l], length, sb, sh, st,
                                               cross_k[l], cross_v[l], cb_rows, T, cb, ch, ct, work, scale);
        if (failed) return failed;
    }
    const struct wkv_int8_linear *v = &p->projection;
    return wkv_int8_rows_step(x, n, d, p->ln_w, p->ln_b, p->ln_eps, work, v->packed, v->scale, v->sum, v->bias,
                              p->vocab, d, 0, NULL, 0, logits, p->vocab);
}
