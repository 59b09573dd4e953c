/* The bfloat16 compute type's decoder step in one call: a block (wkv_bf16_block_step), or the whole
 * decoder (wkv_bf16_decoder_step), for the rows of one cache.
 *
 * As for float32 (block_step.c) and int8 (int8_block_step.c): the calls the call-by-call path makes
 * (cpu/bf16_step.py: each linear with its LayerNorm, bias, GELU and residual through wkv_bf16_rows_step,
 * the attention through wkv_attend_bf16), in the same order on the same inputs, so every number is that
 * path's, bit for bit (tested), without the Python between them. The new keys and values are rounded
 * to bfloat16 as PyTorch rounds them (to nearest, ties to even). Built by cpu/build.py. */
#include <stdint.h>
#include <string.h>

int wkv_bf16_rows_step(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,
                       float *scratch, const uint16_t *packed, const float *bias, long out, long in, int do_gelu,
                       const float *residual, long rs, float *y, long ys);
int wkv_attend_bf16(const float *q, long q_row, const uint16_t *k, const uint16_t *v, float *out, long B, long Q,
                    long H, long T, long kb, long kh, long kt, long vb, long vh, long vt, float scale);

/* One Bfloat16Linear as the rows kernel holds it (cpu/bf16_linear.py). */
struct wkv_bf16_linear {
    const uint16_t *packed;
    const float *bias; /* or NULL */
};

/* One block's parameters (set once per block by cpu/bf16_step.py). */
struct wkv_bf16_block {
    const float *attn_ln_w, *attn_ln_b, *cross_ln_w, *cross_ln_b, *mlp_ln_w, *mlp_ln_b;
    float attn_ln_eps, cross_ln_eps, mlp_ln_eps;
    struct wkv_bf16_linear qkv, out, query, cross_out, up, down;
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

static int linear(const struct wkv_bf16_linear *l, const float *x, long n, long in, long out, const float *ln_w,
                  const float *ln_b, float eps, float *scratch, int do_gelu, const float *residual, float *y)
{
    return wkv_bf16_rows_step(x, n, in, ln_w, ln_b, eps, scratch, l->packed, l->bias, out, in, do_gelu, residual,
                              out, y, out);
}

/* x [n, d] (contiguous) → the block's output, in place.
 * self_k/self_v: the bfloat16 Self-KV [n, H, capacity, 64] (strides sb, sh, st in elements); its first
 * `length` positions are held, the new position is written at `length` (the caller counts it).
 * cross_k/cross_v: the window's bfloat16 Cross-KV [cb_rows, H, T, 64] (strides cb, ch, ct), n a multiple
 * of cb_rows. work: n * (6 d + hidden) floats. Returns 0, or the failing call's code. */
int wkv_bf16_block_step(const struct wkv_bf16_block *p, float *x, long n, uint16_t *self_k, uint16_t *self_v,
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

/* The bfloat16 type's whole decoder (set once per model by cpu/bf16_decoder_step.py). */
struct wkv_bf16_decoder {
    const struct wkv_bf16_block *const *blocks; /* [layers] */
    long layers;
    const uint16_t *table; /* the tied token table, packed as the vocabulary's linear (wkv_bf16_pack) */
    long vocab;
    const float *positions; /* the positional embedding [n_ctx, d] */
    long n_ctx;
    const float *ln_w, *ln_b; /* the final LayerNorm */
    float ln_eps;
};

/* Token t's row of the packed table, widened exactly, plus the position's row: PyTorch's one float32
 * addition (Bfloat16Embedding, then TextDecoder._embed). */
__attribute__((optimize("no-fast-math", "fp-contract=off"))) static void embed(const struct wkv_bf16_decoder *p,
                                                                              const long *tokens, long n,
                                                                              long position, long d, float *x)
{
    const long pairs = d / 2;
    for (long r = 0; r < n; r++) {
        const long t = tokens[r];
        const uint16_t *lane = p->table + (t / 64) * pairs * 128 + (t % 64) * 2;
        const float *at = p->positions + position * d;
        for (long k = 0; k < d; k++) {
            union { uint32_t bits; float value; } wide = {.bits = (uint32_t)lane[(k / 2) * 128 + k % 2] << 16};
            x[r * d + k] = wide.value + at[k];
        }
    }
}

/* One step of the whole bfloat16 decoder for the n rows of ONE cache, every row at `position`, as
 * wkv_int8_decoder_step is for int8: embed, every block (wkv_bf16_block_step), then the vocabulary with
 * the final LayerNorm in its call (wkv_bf16_rows_step, as Bf16StepRows calls it) into logits [n, vocab].
 * Caches: bfloat16, layer l's at self_k[l], self_v[l], cross_k[l], cross_v[l], every layer's of the same
 * shapes and strides. x: n * d floats; work: n * (6 d + hidden) floats.
 * Returns 0; 2 for a position past the table, 3 for a token outside the vocabulary (nothing written);
 * else the failing call's code. */
int wkv_bf16_decoder_step(const struct wkv_bf16_decoder *p, const long *tokens, long n, long position,
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
        const int failed = wkv_bf16_block_step(p->blocks[l], x, n, self_k[l], self_v[l], length, sb, sh, st,
                                               cross_k[l], cross_v[l], cb_rows, T, cb, ch, ct, work, scale);
        if (failed) return failed;
    }
    return wkv_bf16_rows_step(x, n, d, p->ln_w, p->ln_b, p->ln_eps, work, p->table, NULL, p->vocab, d, 0, NULL, 0,
                              logits, p->vocab);
}
