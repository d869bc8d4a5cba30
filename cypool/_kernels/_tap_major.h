/* A convolution's weights, tap-major, as the register tiles read them
 * (cypool/_kernels/_conv.pxi for the phase kernels, cypool/_kernels/_conv_direct.pxi for the
 * direct ones): with t = (c * kh + i) * kw + j,
 *
 *   wt[t * ldt + o] = w[o][c][i][j]                      (the forward)
 *   wt[t * ldt + o] = w[c][o][kh - 1 - i][kw - 1 - j]    (transposed: the
 *                                                         input gradient's kernel)
 *
 * and zeros from the last output channel to ldt. w is read through its
 * byte strides. It is a transpose: in 4 x 4 blocks of float (2 x 2 of
 * double) wherever a kernel's taps lie side by side in memory, forwards
 * (the forward) or backwards (transposed), else one value at a time. One
 * value at a time, a large weight's copy was a quarter of a small call.
 * cypool_tap_rows_* transposes the same way the taps' vectors of a chunk
 * of output positions into rows of im2col (the weight gradient's).
 */
#ifndef CYPOOL_TAP_MAJOR_H
#define CYPOOL_TAP_MAJOR_H
#include <stddef.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__SSE2__)
/* Rows o0..o0+B-1 of B taps, read at a (each row sc bytes on), to the
 * tap rows d[0], d[ldt], ... (or from the last, backwards). */
static inline void cypool_tm_block_f32(const char *a, ptrdiff_t sc, float *d, ptrdiff_t ldt,
                                       int backwards)
{
    __m128 r0 = _mm_loadu_ps((const float *)a), r1 = _mm_loadu_ps((const float *)(a + sc));
    __m128 r2 = _mm_loadu_ps((const float *)(a + 2 * sc));
    __m128 r3 = _mm_loadu_ps((const float *)(a + 3 * sc));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    if (backwards) {
        __m128 t = r0; r0 = r3; r3 = t; t = r1; r1 = r2; r2 = t;
    }
    _mm_storeu_ps(d, r0);
    _mm_storeu_ps(d + ldt, r1);
    _mm_storeu_ps(d + 2 * ldt, r2);
    _mm_storeu_ps(d + 3 * ldt, r3);
}

static inline void cypool_tm_block_f64(const char *a, ptrdiff_t sc, double *d, ptrdiff_t ldt,
                                       int backwards)
{
    __m128d r0 = _mm_loadu_pd((const double *)a), r1 = _mm_loadu_pd((const double *)(a + sc));
    __m128d t0 = _mm_unpacklo_pd(r0, r1), t1 = _mm_unpackhi_pd(r0, r1);
    _mm_storeu_pd(d, backwards ? t1 : t0);
    _mm_storeu_pd(d + ldt, backwards ? t0 : t1);
}
#define CYPOOL_TM_BLOCK_F32 4
#define CYPOOL_TM_BLOCK_F64 2
#else
#define CYPOOL_TM_BLOCK_F32 0
#define CYPOOL_TM_BLOCK_F64 0
#endif

#if defined(__SSE2__)
/* The same blocks from B rows at pointers a[0..B-1] (not a fixed stride). */
static inline void cypool_tm_rows_f32(const float *const *a, float *d, ptrdiff_t ldd)
{
    __m128 r0 = _mm_loadu_ps(a[0]), r1 = _mm_loadu_ps(a[1]);
    __m128 r2 = _mm_loadu_ps(a[2]), r3 = _mm_loadu_ps(a[3]);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(d, r0);
    _mm_storeu_ps(d + ldd, r1);
    _mm_storeu_ps(d + 2 * ldd, r2);
    _mm_storeu_ps(d + 3 * ldd, r3);
}

static inline void cypool_tm_rows_f64(const double *const *a, double *d, ptrdiff_t ldd)
{
    __m128d r0 = _mm_loadu_pd(a[0]), r1 = _mm_loadu_pd(a[1]);
    _mm_storeu_pd(d, _mm_unpacklo_pd(r0, r1));
    _mm_storeu_pd(d + ldd, _mm_unpackhi_pd(r0, r1));
}
#endif

#define CYPOOL_TM_DEFINE(T, SUF, B)                                                  \
static inline void cypool_tap_major_##SUF(const char *w, const ptrdiff_t *shape,     \
        const ptrdiff_t *st, int transposed, ptrdiff_t ldt, T *wt)                   \
{                                                                                    \
    const ptrdiff_t R = transposed ? shape[0] : shape[1];   /* tap channels */      \
    const ptrdiff_t Oc = transposed ? shape[1] : shape[0];  /* output channels */   \
    const ptrdiff_t sr = transposed ? st[0] : st[1], sc = transposed ? st[1] : st[0]; \
    const ptrdiff_t kh = shape[2], kw = shape[3], kk = kh * kw;                      \
    const ptrdiff_t isz = (ptrdiff_t)sizeof(T);                                      \
    /* A channel's kk taps side by side in memory, in tap order: */                  \
    const int runs = B > 0 && st[3] == isz && st[2] == kw * isz;                     \
    for (ptrdiff_t r = 0; r < R; r++) {                                              \
        T *row = wt + r * kk * ldt;                                                  \
        ptrdiff_t q = 0;                                                             \
        for (; runs && q + B <= kk; q += B) {                                        \
            /* Taps q..q+B-1 (transposed: read from tap q+B-1's value on). */        \
            const char *a = w + r * sr + (transposed ? kk - q - B : q) * isz;        \
            ptrdiff_t o = 0;                                                         \
            for (; o + B <= Oc; o += B)                                              \
                cypool_tm_block_##SUF(a + o * sc, sc, row + q * ldt + o, ldt, transposed); \
            for (; o < Oc; o++)                                                      \
                for (ptrdiff_t k = 0; k < B; k++)                                    \
                    row[(q + k) * ldt + o] =                                         \
                        *(const T *)(a + o * sc + (transposed ? B - 1 - k : k) * isz); \
        }                                                                            \
        for (; q < kk; q++) {                                                        \
            ptrdiff_t i = q / kw, j = q - q / kw * kw;                               \
            if (transposed) { i = kh - 1 - i; j = kw - 1 - j; }                      \
            const char *a = w + r * sr + i * st[2] + j * st[3];                      \
            for (ptrdiff_t o = 0; o < Oc; o++)                                       \
                row[q * ldt + o] = *(const T *)(a + o * sc);                         \
        }                                                                            \
        for (q = 0; q < kk; q++)                                                     \
            for (ptrdiff_t o = Oc; o < ldt; o++)                                     \
                row[q * ldt + o] = 0;                                                \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* out[e * K + k] = base[off[k] + e] for e < n, k < K: the taps' vectors,      \
 * K of them, as n rows of K values (a chunk's im2col rows, for the weight      \
 * gradient), in the same blocks. */                                           \
static inline void cypool_tap_rows_##SUF(const T *base, const ptrdiff_t *off,        \
        ptrdiff_t K, ptrdiff_t n, T *out)                                            \
{                                                                                    \
    /* B positions at a time, all taps: out is written row after row, and      \
     * the taps' cache lines are read again by the next B positions. */        \
    ptrdiff_t e = 0;                                                                 \
    for (; B > 0 && e + B <= n; e += B) {                                            \
        ptrdiff_t k = 0;                                                             \
        for (; k + B <= K; k += B) {                                                 \
            const T *a[4];                                                           \
            for (int i = 0; i < B; i++)                                              \
                a[i] = base + off[k + i] + e;                                        \
            cypool_tm_rows_##SUF(a, out + e * K + k, K);                             \
        }                                                                            \
        for (; k < K; k++)                                                           \
            for (int l = 0; l < B; l++)                                              \
                out[(e + l) * K + k] = base[off[k] + e + l];                         \
    }                                                                                \
    for (; e < n; e++)                                                               \
        for (ptrdiff_t k = 0; k < K; k++)                                            \
            out[e * K + k] = base[off[k] + e];                                       \
}

#if !defined(__SSE2__)
/* Never called (B = 0): for the compiler only. */
static inline void cypool_tm_block_f32(const char *a, ptrdiff_t sc, float *d, ptrdiff_t ldt,
                                       int backwards) { (void)a; (void)sc; (void)d; (void)ldt; (void)backwards; }
static inline void cypool_tm_block_f64(const char *a, ptrdiff_t sc, double *d, ptrdiff_t ldt,
                                       int backwards) { (void)a; (void)sc; (void)d; (void)ldt; (void)backwards; }
static inline void cypool_tm_rows_f32(const float *const *a, float *d, ptrdiff_t ldd)
{ (void)a; (void)d; (void)ldd; }
static inline void cypool_tm_rows_f64(const double *const *a, double *d, ptrdiff_t ldd)
{ (void)a; (void)d; (void)ldd; }
#endif

CYPOOL_TM_DEFINE(float, f32, CYPOOL_TM_BLOCK_F32)
CYPOOL_TM_DEFINE(double, f64, CYPOOL_TM_BLOCK_F64)

#endif
