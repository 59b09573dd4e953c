/* Float32 decoder-step linears: LayerNorm, product, bias, GELU and residual in one call per linear.
 *
 * A float32 decoder step multiplies a few rows (one per greedy window, five per beam-5 window) by 24
 * small matrices (tiny.en). Through PyTorch each is a GEMM plus a dozen small tensor operations around
 * it (padding to two columns, transposes, copies, the LayerNorm before it, the bias, GELU and residual
 * after it): about half of a step's layer time here was those operations, not the reads of weights.
 * Here one call does the LayerNorm of its input rows, the product, the bias, GELU and the residual.
 *
 * Each output of each row is one dot product in a fixed order (16 lanes of fused multiply-adds along
 * the input, then a fixed reduction tree), whatever the number of rows, their order or the thread
 * count: a row's numbers never depend on the rows beside it, so a request batched with others gets the
 * bits it gets alone. The order differs from PyTorch's, so outputs differ from its in the last bits
 * (as the row GEMMs' and the attention kernel's do): transcripts stay the reference's token for token
 * (parity tests, verify, and the row-GEMM path kept as this kernel's slow twin in the tests).
 * Compiled without -ffast-math, so each operation rounds as written. Built by cpu/build.py. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

#define LANES 16 /* floats per vector; the input width must be a multiple of it */
#define OUTS 4   /* outputs per pass over the rows (the last out % OUTS one at a time) */
/* rows per pass: OUTS x RB sums held in registers. Five with AVX-512 (20 sums, 5 inputs and a weight
 * vector in its 32 registers): a beam-5 window's rows in one pass over each weight block, not 4 + 1
 * (tiny.en's vocabulary product for 5 rows, caches flushed: 1.89 ms as 4 + 1, scratch, round 14). */
#if defined(__AVX512F__)
#define RB 5
#else
#define RB 4
#endif

/* Output blocks ahead whose weights are fetched (into the core's L2) while this one is multiplied: the
 * weights are read once per step and are not in the CPU cache (the step's other reads push them out).
 * Replaying a tiny.en greedy step's 24 linears and vocabulary product on its weights (scratch), 8 blocks
 * into L2 took 1.18 + 2.58 ms, 12 blocks into L1 (which they overflow) 2.22 + 4.35, none 2.5 + 4.4. */
#ifndef AHEAD
#define AHEAD 8
#endif
#ifndef HINT
#define HINT _MM_HINT_T1
#endif

#if defined(__AVX512F__)
static inline void prefetch(const void *p) { _mm_prefetch((const char *)p, HINT); }
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vload_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vec v)
{
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 a = _mm256_add_ps(lo, hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* AVX2 (e.g. AMD Zen 3): a vector is two 8-lane halves, lanes 0-7 and 8-15, each lane the same fused
 * multiply-add as with AVX-512 and the same reduction tree (lane i + lane i + 8 first), so the sums are
 * the AVX-512 build's bits. Without it an AVX2 CPU ran the scalar loops below (a tiny.en engine step of
 * one row: 62 ms, so the row GEMMs were used there: 9.1 ms; through this path 3.4 ms). */
static inline void prefetch(const void *p) { _mm_prefetch((const char *)p, HINT); }
typedef struct {
    __m256 lo, hi;
} vec;
static inline vec vzero(void) { return (vec){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vec vload(const float *p) { return (vec){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline vec vload_half(const uint16_t *p)
{
    return (vec){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
static inline vec vfma(vec a, vec b, vec c)
{
    return (vec){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
static inline float vsum(vec v)
{
    const __m256 a = _mm256_add_ps(v.lo, v.hi);
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#else /* the same order of operations, one lane at a time */
static inline void prefetch(const void *p) { __builtin_prefetch(p); }
typedef struct {
    float v[LANES];
} vec;
static inline vec vzero(void)
{
    vec r;
    for (int i = 0; i < LANES; i++) r.v[i] = 0.f;
    return r;
}
static inline vec vload(const float *p)
{
    vec r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
static inline float half_to_float(uint16_t h) /* exact: every float16 is a float32 */
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
    union { uint32_t bits; float value; } out;
    if (exponent == 31) out.bits = sign | 0x7f800000u | (mantissa << 13); /* inf, nan */
    else if (exponent) out.bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else { /* zero or subnormal: mantissa x 2^-24, exact in float32 */
        out.value = (float)mantissa * 0x1p-24f;
        out.bits |= sign;
    }
    return out.value;
}
static inline vec vload_half(const uint16_t *p)
{
    vec r;
    for (int i = 0; i < LANES; i++) r.v[i] = half_to_float(p[i]);
    return r;
}
static inline vec vfma(vec a, vec b, vec c)
{
    for (int i = 0; i < LANES; i++) c.v[i] = fmaf(a.v[i], b.v[i], c.v[i]);
    return c;
}
static inline float vsum(vec v)
{
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = v.v[i] + v.v[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    const float c0 = b[0] + b[2], c1 = b[1] + b[3];
    return c0 + c1;
}
#endif

/* GELU, x/2 (1 + erf(x / sqrt 2)), with erf as PyTorch's vectorized CPU kernels write it (Abramowitz &
 * Stegun 7.1.26, |error| < 1.5e-7) and exp(-x^2) from a degree-6 polynomial after range reduction:
 * within 2.6e-7 of the exact GELU where PyTorch's is within 1.0e-6 (scratch, round 15). Why not libm's
 * erff, one value at a time: a beam-5 int8 step's four MLPs took 0.5 ms in it, a 200-token prompt's 22
 * ms. Sixteen at a time with AVX-512; one at a time (the tail of a row, or without AVX-512) through
 * the same operations in the same order, each rounded alike (fmaf where the vector code fuses), so a
 * value's bits do not depend on where in a row it falls. */
#define GELU_CONSTANTS                                                                                    \
    const float c_sqrt1_2 = (float)M_SQRT1_2, c_p = 0.3275911f, c_p5 = 1.061405429f, c_p4 = -1.453152027f, \
                c_p3 = 1.421413741f, c_p2 = -0.284496736f, c_p1 = 0.254829592f, c_log2e = 1.44269504f,     \
                c_ln2_hi = 0.693145752f, c_ln2_lo = 1.42860677e-6f

static inline float gelu_one(float x)
{
    GELU_CONSTANTS;
    const float a = fabsf(x * c_sqrt1_2), t = 1.f / fmaf(c_p, a, 1.f);
    float r = fmaf(c_p5, t, c_p4);
    r = fmaf(r, t, c_p3);
    r = fmaf(r, t, c_p2);
    r = fmaf(r, t, c_p1);
    const float z = fmaxf((0.f - a) * a, -87.f), n = nearbyintf(z * c_log2e);
    float f = fmaf(-n, c_ln2_hi, z);
    f = fmaf(-n, c_ln2_lo, f);
    float p = fmaf(1.f / 720, f, 1.f / 120);
    p = fmaf(p, f, 1.f / 24);
    p = fmaf(p, f, 1.f / 6);
    p = fmaf(p, f, 0.5f);
    p = fmaf(p, f, 1.f);
    p = fmaf(p, f, 1.f);
    const float rt = r * t, erf_abs = fmaf(-rt, ldexpf(p, (int)n), 1.f);
    uint32_t bits, sign;
    memcpy(&bits, &erf_abs, sizeof bits);
    memcpy(&sign, &x, sizeof sign);
    bits ^= sign & 0x80000000u;
    float erf;
    memcpy(&erf, &bits, sizeof erf);
    return (x * 0.5f) * (1.f + erf);
}

/* GELU of ``count`` values in place (the float32 and int8 step kernels' MLPs). */
void wkv_gelu_row(float *v, long count)
{
    long i = 0;
#if defined(__AVX512F__)
    GELU_CONSTANTS;
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + LANES <= count; i += LANES) {
        const __m512 x = _mm512_loadu_ps(v + i);
        const __m512 a = _mm512_abs_ps(_mm512_mul_ps(x, _mm512_set1_ps(c_sqrt1_2)));
        const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(c_p), a, one));
        __m512 r = _mm512_fmadd_ps(_mm512_set1_ps(c_p5), t, _mm512_set1_ps(c_p4));
        r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(c_p3));
        r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(c_p2));
        r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(c_p1));
        const __m512 z = _mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), a), a), _mm512_set1_ps(-87.f));
        const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(z, _mm512_set1_ps(c_log2e)), _MM_FROUND_TO_NEAREST_INT);
        __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(c_ln2_hi), z);
        f = _mm512_fnmadd_ps(n, _mm512_set1_ps(c_ln2_lo), f);
        __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.f / 720), f, _mm512_set1_ps(1.f / 120));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
        p = _mm512_fmadd_ps(p, f, one);
        p = _mm512_fmadd_ps(p, f, one);
        const __m512 erf_abs = _mm512_fnmadd_ps(_mm512_mul_ps(r, t), _mm512_scalef_ps(p, n), one);
        const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000));
        const __m512 erf = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(erf_abs), sign));
        _mm512_storeu_ps(v + i, _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), _mm512_add_ps(one, erf)));
    }
#endif
    for (; i < count; i++) v[i] = gelu_one(v[i]);
}

/* Dot products of NO weight rows with NR input rows (both fixed, so the sums stay in registers). Each
 * sum is the same sequence of operations whatever NO and NR are: an output's bits never depend on them.
 * Weights of type WT are widened to float32 by LOAD (float16 ones exactly), so a float16 copy of float16
 * values gives the float32 copy's bits. */
#define ROWS_PASS(NO, NR, WT, LOAD)                                                                       \
    static void pass_##NO##_##NR##_##WT(const float *x, long xs, const WT *w, long in, float *dots, long ds) \
    {                                                                                                     \
        vec acc[NO][NR];                                                                                  \
        for (int i = 0; i < NO; i++)                                                                      \
            for (int j = 0; j < NR; j++) acc[i][j] = vzero();                                             \
        for (long k = 0; k < in; k += LANES) {                                                            \
            vec xv[NR];                                                                                   \
            for (int j = 0; j < NR; j++) xv[j] = vload(x + j * xs + k);                                   \
            for (int i = 0; i < NO; i++) {                                                                \
                prefetch(w + (AHEAD * OUTS + i) * in + k);                                                \
                const vec wv = LOAD(w + i * in + k);                                                      \
                for (int j = 0; j < NR; j++) acc[i][j] = vfma(wv, xv[j], acc[i][j]);                      \
            }                                                                                             \
        }                                                                                                 \
        for (int j = 0; j < NR; j++)                                                                      \
            for (int i = 0; i < NO; i++) dots[j * ds + i] = vsum(acc[i][j]);                              \
    }

/* Outputs o .. o + no - 1 (no: OUTS, or 1 for the last few) of every row, with bias and residual (GELU:
 * after the product, a whole row at a time, in the entry below). */
#define OUTPUTS(WT, LOAD)                                                                                 \
    ROWS_PASS(OUTS, 1, WT, LOAD)                                                                          \
    ROWS_PASS(OUTS, 2, WT, LOAD)                                                                          \
    ROWS_PASS(OUTS, 3, WT, LOAD)                                                                          \
    ROWS_PASS(OUTS, 4, WT, LOAD)                                                                          \
    ROWS_PASS(OUTS, 5, WT, LOAD)                                                                          \
    ROWS_PASS(1, 1, WT, LOAD)                                                                             \
    ROWS_PASS(1, 2, WT, LOAD)                                                                             \
    ROWS_PASS(1, 3, WT, LOAD)                                                                             \
    ROWS_PASS(1, 4, WT, LOAD)                                                                             \
    ROWS_PASS(1, 5, WT, LOAD)                                                                             \
    static void outputs_##WT(const float *rows, long stride, long n, const WT *w, long in, long o, long no, \
                             const float *bias, const float *residual, long rs, float *y, long ys)            \
    {                                                                                                     \
        float dots[RB * OUTS];                                                                            \
        for (long r = 0; r < n; r += RB) {                                                                \
            const long nr = n - r < RB ? n - r : RB;                                                      \
            const float *xr = rows + r * stride;                                                          \
            const WT *wo = w + o * in;                                                                    \
            if (no == OUTS) {                                                                             \
                if (nr == 5) pass_OUTS_5_##WT(xr, stride, wo, in, dots, OUTS);                            \
                else if (nr == 4) pass_OUTS_4_##WT(xr, stride, wo, in, dots, OUTS);                       \
                else if (nr == 3) pass_OUTS_3_##WT(xr, stride, wo, in, dots, OUTS);                       \
                else if (nr == 2) pass_OUTS_2_##WT(xr, stride, wo, in, dots, OUTS);                       \
                else pass_OUTS_1_##WT(xr, stride, wo, in, dots, OUTS);                                    \
            } else {                                                                                      \
                if (nr == 5) pass_1_5_##WT(xr, stride, wo, in, dots, OUTS);                               \
                else if (nr == 4) pass_1_4_##WT(xr, stride, wo, in, dots, OUTS);                          \
                else if (nr == 3) pass_1_3_##WT(xr, stride, wo, in, dots, OUTS);                          \
                else if (nr == 2) pass_1_2_##WT(xr, stride, wo, in, dots, OUTS);                          \
                else pass_1_1_##WT(xr, stride, wo, in, dots, OUTS);                                       \
            }                                                                                             \
            for (long j = 0; j < nr; j++)                                                                 \
                for (long i = 0; i < no; i++) {                                                           \
                    float v = dots[j * OUTS + i];                                                         \
                    if (bias) v = v + bias[o + i];                                                        \
                    if (residual) v = residual[(r + j) * rs + o + i] + v;                                 \
                    y[(r + j) * ys + o + i] = v;                                                          \
                }                                                                                         \
        }                                                                                                 \
    }

typedef uint16_t half; /* float16 bits */
OUTPUTS(float, vload)
OUTPUTS(half, vload_half)

static void layer_norm(const float *x, long in, const float *weight, const float *bias, float eps, float *out)
{
    vec s = vzero();
    const vec one = vload((const float[LANES]){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    for (long k = 0; k < in; k += LANES) s = vfma(vload(x + k), one, s);
    const float mean = vsum(s) / (float)in;
    float centred[LANES] __attribute__((aligned(64)));
    vec q = vzero();
    for (long k = 0; k < in; k += LANES) {
        for (int i = 0; i < LANES; i++) centred[i] = x[k + i] - mean;
        const vec c = vload(centred);
        q = vfma(c, c, q);
    }
    const float rstd = 1.f / sqrtf(vsum(q) / (float)in + eps);
    for (long k = 0; k < in; k++) out[k] = (x[k] - mean) * rstd * weight[k] + bias[k];
}

/* The same LayerNorm (``in`` a multiple of LANES), rounded as written, for the int8 step's linears
 * (int8_rows.c: wkv_int8_rows_step), which are compiled with -ffast-math. */
void wkv_layer_norm(const float *x, long in, const float *weight, const float *bias, float eps, float *out)
{
    layer_norm(x, in, weight, bias, eps, out);
}

/* y[r] = epilogue(W · norm(x[r]) + bias) for n rows: x [n, in] (row stride xs), W [out, in] row-major
 * (float32: wkv_rows_f32; float16: wkv_rows_f32_half, widened exactly).
 * norm: LayerNorm with ln_weight/ln_bias/eps when ln_weight is not NULL (into scratch, [n, in]);
 * epilogue: GELU when gelu is set, then + residual[r] (row stride rs) when residual is not NULL.
 * y [n, out] (row stride ys) may be the residual itself. bias may be NULL.
 * Returns 0, or 1 when the input width is not a multiple of LANES: nothing written. */
#define ROWS_ENTRY(NAME, WT)                                                                              \
    int NAME(const float *x, long n, long xs, const float *ln_weight, const float *ln_bias, float eps,   \
             float *scratch, const WT *w, const float *bias, long out, long in, int do_gelu,               \
             const float *residual, long rs, float *y, long ys)                                          \
    {                                                                                                     \
        if (in % LANES || n < 1 || out < 1) return 1;                                                     \
        _Pragma("omp parallel")                                                                           \
        {                                                                                                 \
            const float *rows = x;                                                                        \
            long stride = xs;                                                                             \
            if (ln_weight) {                                                                              \
                _Pragma("omp for schedule(static)") for (long r = 0; r < n; r++)                          \
                    layer_norm(x + r * xs, in, ln_weight, ln_bias, eps, scratch + r * in);                \
                rows = scratch; /* the loop's barrier: every row is normalised before any product */     \
                stride = in;                                                                              \
            }                                                                                             \
            /* each thread's outputs: a contiguous run of blocks, the first AHEAD of them fetched now     \
             * (each pass fetches the block AHEAD blocks after its own) */                                \
            const long blocks = out / OUTS, threads = omp_get_num_threads(), t = omp_get_thread_num();    \
            const long first = blocks * t / threads, last = blocks * (t + 1) / threads;                   \
            const long ahead = last - first < AHEAD ? last - first : AHEAD;                               \
            const char *start = (const char *)(w + first * OUTS * in);                                    \
            for (long byte = 0; byte < ahead * OUTS * in * (long)sizeof(WT); byte += 64)                  \
                prefetch(start + byte);                                                                   \
            const float *add = do_gelu ? NULL : residual; /* with GELU: added after it, below */          \
            for (long o = first * OUTS; o < last * OUTS; o += OUTS)                                       \
                outputs_##WT(rows, stride, n, w, in, o, OUTS, bias, add, rs, y, ys);                      \
            if (t == threads - 1)                                                                         \
                for (long o = blocks * OUTS; o < out; o++)                                                \
                    outputs_##WT(rows, stride, n, w, in, o, 1, bias, add, rs, y, ys);                     \
        }                                                                                                 \
        if (do_gelu) /* each whole row at once, one thread: a value's bits never depend on the threads */ \
            for (long r = 0; r < n; r++) {                                                                \
                wkv_gelu_row(y + r * ys, out);                                                            \
                if (residual)                                                                             \
                    for (long o = 0; o < out; o++) y[r * ys + o] = residual[r * rs + o] + y[r * ys + o];  \
            }                                                                                             \
        return 0;                                                                                         \
    }

ROWS_ENTRY(wkv_rows_f32, float)
ROWS_ENTRY(wkv_rows_f32_half, half)

#pragma GCC pop_options
