/* AVX-512 float32 functions the encoder's kernels share: encoder_attend.c (the softmax's exponent) and
 * encoder_linear.c (GELU's erf). Each is a polynomial, accurate to a few float32 ulps: the results are
 * rounded to bfloat16 (8 bits) right after. */
#ifndef WKV_AVX512_MATH_H
#define WKV_AVX512_MATH_H
#if defined(__AVX512F__)
#include <immintrin.h>

/* 2^t for t <= 0; 0 below 2^-126, the smallest normal float32. Why not the denormal there: making one
 * costs a microcode assist on Intel cores (~150 cycles a lane), and a softmax row of 1,500 scores has
 * many that far below its largest; beside that largest term (1) they were nothing anyway, and the bfloat16
 * rounding and AMX's products flush them to 0. NaN stays NaN. */
static inline __m512 exp2_nonpositive(__m512 t)
{
    const __m512 least = _mm512_set1_ps(-126.0f);
    const __mmask16 normal = _mm512_cmp_ps_mask(t, least, _CMP_NLT_UQ); /* t >= -126, or NaN */
    t = _mm512_max_ps(least, t);                                          /* NaN: t itself */
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n); /* [-0.5, 0.5]: 2^f by a polynomial, relative error 2e-7 */
    __m512 p = _mm512_set1_ps(1.3400433e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6760374e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503272e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022107e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001f));
    return _mm512_maskz_scalef_ps(normal, p, n);
}

/* e^y for y <= 0, to about one float32 ulp: y = n ln2 + r with ln2 in two parts (Cody and Waite, so r
 * is exact), e^r on [-ln2/2, ln2/2] by its Taylor polynomial to r^7. 0 below e^-87 (near the smallest
 * normal float32; why not the denormals: exp2_nonpositive): GELU's erf takes e^(-x^2) for large |x|,
 * where 1 - (a tiny term) rounds to 1 either way, and a softmax's sum adds it to its largest term, 1. */
static inline __m512 exp_nonpositive(__m512 y)
{
    const __m512 least = _mm512_set1_ps(-87.0f);
    const __mmask16 normal = _mm512_cmp_ps_mask(y, least, _CMP_NLT_UQ); /* y >= -87, or NaN */
    y = _mm512_max_ps(least, y);                                          /* NaN: y itself */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), y);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(normal, p, n);
}

/* erf(x): Abramowitz and Stegun's 7.1.26, 1 - (a1 t + ... + a5 t^5) exp(-x^2) with t = 1 / (1 + p|x|),
 * the sign of x put back (absolute error at most 1.5e-7). t by a reciprocal estimate and one Newton
 * step (28 bits; a division took twice as long as the rest of GELU). Where 1 + erf(x) cancels (x below
 * about -2) this and PyTorch's own erf round GELU to bfloat16 differently now and then (values under
 * 1e-3; this one is the nearer to the exact GELU there). */
static inline __m512 erf_ps(__m512 x)
{
    const __m512 sign = _mm512_and_ps(x, _mm512_set1_ps(-0.0f)), one = _mm512_set1_ps(1.0f);
    const __m512 a = _mm512_min_ps(_mm512_set1_ps(5.0f), _mm512_abs_ps(x)); /* NaN: |x| itself */
    const __m512 d = _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), a, one), r = _mm512_rcp14_ps(d);
    const __m512 t = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
    __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(1.061405429f), t, _mm512_set1_ps(-1.453152027f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(1.421413741f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(-0.284496736f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(0.254829592f));
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, a)));
    const __m512 et = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), e), t);
    return _mm512_or_ps(sign, _mm512_fmadd_ps(et, poly, one));
}
#endif
#endif
