/* The loops gcc does not vectorise well from Cython, written with
 * intrinsics:
 *
 * - the chunk scans of the argmax kernel (cypool/_kernels/_argmax.pxi), an AVX2 copy
 *   (x86-64-v3 and v4 builds) and an SSE2 copy (baseline), plain loops
 *   elsewhere. gcc 12 does not vectorise a NaN-aware max written in Cython.
 *   cypool_chunk_max_* returns 1 if x[:n] holds a NaN and sets *out to the
 *   maximum of the non-NaN values (or -inf): MAXPS computes exactly
 *   v > m ? v : m, and CMPUNORDPS flags NaN. cypool_first_* finds where a
 *   chunk's maximum (or first NaN) came from. The same loops written once
 *   with GCC vector types measured slower, even with MAXPS and MOVMSKPS
 *   kept as the target's instructions (docs/performance.md);
 * - the streaming stores of the max-pool indices, and the float32 passes of
 *   the flat 3x3 max pool that carry them (AVX2; gcc has no generic
 *   non-temporal store).
 */
#ifndef CYPOOL_SIMD_H
#define CYPOOL_SIMD_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _MSC_VER
#include <intrin.h>
static inline int cypool_ctz(unsigned m) { unsigned long i; _BitScanForward(&i, m); return (int)i; }
#else
#define cypool_ctz(m) __builtin_ctz(m)
#endif
/* The chunk-max loops read the maps once, front to back, so the input's
 * speed is that of memory: they prefetch 4 KiB ahead (the best distance
 * measured, docs/performance.md). Each loop iteration reads 64 or 128 bytes. */
#define CYPOOL_PREFETCH_BYTES 4096
#define CYPOOL_PREFETCH_64(p) \
    _mm_prefetch((const char *)(p) + CYPOOL_PREFETCH_BYTES, _MM_HINT_T0)
#define CYPOOL_PREFETCH_128(p) \
    do { CYPOOL_PREFETCH_64(p); CYPOOL_PREFETCH_64((const char *)(p) + 64); } while (0)

#if defined(__AVX2__)
#include <immintrin.h>

/* The AVX2 variant (x86-64-v3 build): the same loops on 256-bit vectors. */
static inline int cypool_chunk_max_f32(const float *x, ptrdiff_t n, float *out)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256 u0 = _mm256_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        CYPOOL_PREFETCH_128(x + i);
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
        m0 = _mm256_max_ps(a, m0); m1 = _mm256_max_ps(b, m1);
        m2 = _mm256_max_ps(c, m2); m3 = _mm256_max_ps(d, m3);
        u0 = _mm256_or_ps(u0, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        u1 = _mm256_or_ps(u1, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
        u2 = _mm256_or_ps(u2, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
        u3 = _mm256_or_ps(u3, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
    }
    m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    u0 = _mm256_or_ps(_mm256_or_ps(u0, u1), _mm256_or_ps(u2, u3));
    float lanes[8];
    _mm256_storeu_ps(lanes, m0);
    float m = lanes[0];
    for (int l = 1; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    int nan = _mm256_movemask_ps(u0) != 0;
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    *out = m;
    return nan;
}

static inline int cypool_chunk_max_f64(const double *x, ptrdiff_t n, double *out)
{
    __m256d m0 = _mm256_set1_pd(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m256d u0 = _mm256_setzero_pd(), u1 = u0, u2 = u0, u3 = u0;
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        CYPOOL_PREFETCH_128(x + i);
        __m256d a = _mm256_loadu_pd(x + i), b = _mm256_loadu_pd(x + i + 4);
        __m256d c = _mm256_loadu_pd(x + i + 8), d = _mm256_loadu_pd(x + i + 12);
        m0 = _mm256_max_pd(a, m0); m1 = _mm256_max_pd(b, m1);
        m2 = _mm256_max_pd(c, m2); m3 = _mm256_max_pd(d, m3);
        u0 = _mm256_or_pd(u0, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
        u1 = _mm256_or_pd(u1, _mm256_cmp_pd(b, b, _CMP_UNORD_Q));
        u2 = _mm256_or_pd(u2, _mm256_cmp_pd(c, c, _CMP_UNORD_Q));
        u3 = _mm256_or_pd(u3, _mm256_cmp_pd(d, d, _CMP_UNORD_Q));
    }
    m0 = _mm256_max_pd(_mm256_max_pd(m0, m1), _mm256_max_pd(m2, m3));
    u0 = _mm256_or_pd(_mm256_or_pd(u0, u1), _mm256_or_pd(u2, u3));
    double lanes[4];
    _mm256_storeu_pd(lanes, m0);
    double m = lanes[0];
    for (int l = 1; l < 4; l++) m = lanes[l] > m ? lanes[l] : m;
    int nan = _mm256_movemask_pd(u0) != 0;
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    *out = m;
    return nan;
}

static inline ptrdiff_t cypool_first_f32(const float *x, ptrdiff_t n, float t, int want_nan)
{
    __m256 tv = _mm256_set1_ps(t);
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        int mask = _mm256_movemask_ps(want_nan ? _mm256_cmp_ps(a, a, _CMP_UNORD_Q)
                                               : _mm256_cmp_ps(a, tv, _CMP_EQ_OQ));
        if (mask) return i + cypool_ctz(mask);
    }
    for (; i < n; i++)
        if (want_nan ? x[i] != x[i] : x[i] == t) return i;
    return 0;
}

static inline ptrdiff_t cypool_first_f64(const double *x, ptrdiff_t n, double t, int want_nan)
{
    __m256d tv = _mm256_set1_pd(t);
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d a = _mm256_loadu_pd(x + i);
        int mask = _mm256_movemask_pd(want_nan ? _mm256_cmp_pd(a, a, _CMP_UNORD_Q)
                                               : _mm256_cmp_pd(a, tv, _CMP_EQ_OQ));
        if (mask) return i + cypool_ctz(mask);
    }
    for (; i < n; i++)
        if (want_nan ? x[i] != x[i] : x[i] == t) return i;
    return 0;
}

#elif defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>

static inline int cypool_chunk_max_f32(const float *x, ptrdiff_t n, float *out)
{
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m128 u0 = _mm_setzero_ps(), u1 = u0, u2 = u0, u3 = u0;
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) {
        CYPOOL_PREFETCH_64(x + i);
        __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
        __m128 c = _mm_loadu_ps(x + i + 8), d = _mm_loadu_ps(x + i + 12);
        m0 = _mm_max_ps(a, m0); m1 = _mm_max_ps(b, m1);
        m2 = _mm_max_ps(c, m2); m3 = _mm_max_ps(d, m3);
        u0 = _mm_or_ps(u0, _mm_cmpunord_ps(a, a)); u1 = _mm_or_ps(u1, _mm_cmpunord_ps(b, b));
        u2 = _mm_or_ps(u2, _mm_cmpunord_ps(c, c)); u3 = _mm_or_ps(u3, _mm_cmpunord_ps(d, d));
    }
    m0 = _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
    u0 = _mm_or_ps(_mm_or_ps(u0, u1), _mm_or_ps(u2, u3));
    float lanes[4];
    _mm_storeu_ps(lanes, m0);
    float m = lanes[0];
    for (int l = 1; l < 4; l++) m = lanes[l] > m ? lanes[l] : m;
    int nan = _mm_movemask_ps(u0) != 0;
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    *out = m;
    return nan;
}

static inline int cypool_chunk_max_f64(const double *x, ptrdiff_t n, double *out)
{
    __m128d m0 = _mm_set1_pd(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m128d u0 = _mm_setzero_pd(), u1 = u0, u2 = u0, u3 = u0;
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        CYPOOL_PREFETCH_64(x + i);
        __m128d a = _mm_loadu_pd(x + i), b = _mm_loadu_pd(x + i + 2);
        __m128d c = _mm_loadu_pd(x + i + 4), d = _mm_loadu_pd(x + i + 6);
        m0 = _mm_max_pd(a, m0); m1 = _mm_max_pd(b, m1);
        m2 = _mm_max_pd(c, m2); m3 = _mm_max_pd(d, m3);
        u0 = _mm_or_pd(u0, _mm_cmpunord_pd(a, a)); u1 = _mm_or_pd(u1, _mm_cmpunord_pd(b, b));
        u2 = _mm_or_pd(u2, _mm_cmpunord_pd(c, c)); u3 = _mm_or_pd(u3, _mm_cmpunord_pd(d, d));
    }
    m0 = _mm_max_pd(_mm_max_pd(m0, m1), _mm_max_pd(m2, m3));
    u0 = _mm_or_pd(_mm_or_pd(u0, u1), _mm_or_pd(u2, u3));
    double lanes[2];
    _mm_storeu_pd(lanes, m0);
    double m = lanes[1] > lanes[0] ? lanes[1] : lanes[0];
    int nan = _mm_movemask_pd(u0) != 0;
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    *out = m;
    return nan;
}

/* First i with x[i] == t (t not NaN), or with x[i] NaN when want_nan. */
static inline ptrdiff_t cypool_first_f32(const float *x, ptrdiff_t n, float t, int want_nan)
{
    __m128 tv = _mm_set1_ps(t);
    ptrdiff_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 a = _mm_loadu_ps(x + i);
        int mask = _mm_movemask_ps(want_nan ? _mm_cmpunord_ps(a, a) : _mm_cmpeq_ps(a, tv));
        if (mask) return i + cypool_ctz(mask);
    }
    for (; i < n; i++)
        if (want_nan ? x[i] != x[i] : x[i] == t) return i;
    return 0;
}

static inline ptrdiff_t cypool_first_f64(const double *x, ptrdiff_t n, double t, int want_nan)
{
    __m128d tv = _mm_set1_pd(t);
    ptrdiff_t i = 0;
    for (; i + 2 <= n; i += 2) {
        __m128d a = _mm_loadu_pd(x + i);
        int mask = _mm_movemask_pd(want_nan ? _mm_cmpunord_pd(a, a) : _mm_cmpeq_pd(a, tv));
        if (mask) return i + cypool_ctz(mask);
    }
    for (; i < n; i++)
        if (want_nan ? x[i] != x[i] : x[i] == t) return i;
    return 0;
}
#else
#define CYPOOL_FIRST(T, NAME)                                            \
    static inline ptrdiff_t NAME(const T *x, ptrdiff_t n, T t, int want_nan) \
    {                                                                    \
        for (ptrdiff_t i = 0; i < n; i++)                                \
            if (want_nan ? x[i] != x[i] : x[i] == t) return i;           \
        return 0;                                                        \
    }
CYPOOL_FIRST(float, cypool_first_f32)
CYPOOL_FIRST(double, cypool_first_f64)
#define CYPOOL_CHUNK_MAX(T, NAME)                                        \
    static inline int NAME(const T *x, ptrdiff_t n, T *out)              \
    {                                                                    \
        T m = -INFINITY; int nan = 0;                                    \
        for (ptrdiff_t i = 0; i < n; i++) {                              \
            m = x[i] > m ? x[i] : m;                                     \
            nan |= x[i] != x[i];                                         \
        }                                                                \
        *out = m;                                                        \
        return nan;                                                      \
    }
CYPOOL_CHUNK_MAX(float, cypool_chunk_max_f32)
CYPOOL_CHUNK_MAX(double, cypool_chunk_max_f64)
#endif
/* Non-temporal stores, for outputs written once and not read again soon
 * (max-pool indices: only the backward pass reads them). The stores skip
 * the cache: they do not read the destination lines first, and they do not
 * evict what the next layer reads. Only whole 64-byte lines are streamed;
 * the partial lines at both ends of a plane take plain stores (a line
 * written both ways is flushed half-written). The streamed bytes are
 * visible to other threads only after cypool_stream_fence(), which each
 * thread calls once after its last plane (a fence per plane serialises the
 * stores). */
#if defined(__AVX2__)
#define CYPOOL_STREAM_VEC 32
#define CYPOOL_STREAM_STORE(d, s) \
    _mm256_stream_si256((__m256i *)(d), _mm256_loadu_si256((const __m256i *)(s)))
#elif defined(__SSE2__) || defined(_M_X64)
#define CYPOOL_STREAM_VEC 16
#define CYPOOL_STREAM_STORE(d, s) \
    _mm_stream_si128((__m128i *)(d), _mm_loadu_si128((const __m128i *)(s)))
#endif
/* One 64-byte line of int32 indices from src to dst (64-byte aligned):
 * copied (16 indices), or widened to int64 when wide (8 indices). */
static inline void cypool_stream_line(char *dst, const int32_t *src, int wide)
{
#ifdef CYPOOL_STREAM_VEC
    if (!wide) {
        for (int v = 0; v < 64; v += CYPOOL_STREAM_VEC)
            CYPOOL_STREAM_STORE(dst + v, (const char *)src + v);
        return;
    }
#if defined(__AVX2__)
    __m128i a = _mm_loadu_si128((const __m128i *)src);
    __m128i b = _mm_loadu_si128((const __m128i *)(src + 4));
    _mm256_stream_si256((__m256i *)dst, _mm256_cvtepi32_epi64(a));
    _mm256_stream_si256((__m256i *)(dst + 32), _mm256_cvtepi32_epi64(b));
#else
    for (int h = 0; h < 8; h += 4) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + h));
        __m128i sign = _mm_srai_epi32(a, 31);
        _mm_stream_si128((__m128i *)(dst + 8 * h), _mm_unpacklo_epi32(a, sign));
        _mm_stream_si128((__m128i *)(dst + 8 * h + 16), _mm_unpackhi_epi32(a, sign));
    }
#endif
#else
    (void)dst; (void)src; (void)wide;
#endif
}

/* dst[:n] = src[:n] with plain stores, as int64 when wide. */
static inline void cypool_plain_copy(char *dst, const int32_t *src, size_t n, int wide)
{
    if (wide)
        for (size_t i = 0; i < n; i++) ((int64_t *)dst)[i] = src[i];
    else
        memcpy(dst, src, n * sizeof(int32_t));
}

/* A plane of int32 indices on its way out to its place in the output, as
 * int64 when wide: the max pool pools a plane's indices into a per-thread
 * buffer and hands it over here. cypool_pending_start writes the partial
 * line at the head with plain stores; the whole lines are streamed either
 * at once, by cypool_pending_finish, or one an iteration by the next
 * plane's passes (cypool_flat3_h_f32, then cypool_flat3_v_f32), so that
 * they drain while that plane is pooled instead of stalling the core in one
 * burst; cypool_pending_finish streams what is left and writes the partial
 * last line with plain stores. */
typedef struct {
    char *dst;           /* where the next index goes */
    const int32_t *src;  /* the next index */
    size_t left;         /* indices still to write */
    int wide;            /* int32 to int64 */
} cypool_pending;

static inline void cypool_pending_start(cypool_pending *p, void *dst, const int32_t *src,
                                        size_t n, int wide)
{
    size_t size = wide ? sizeof(int64_t) : sizeof(int32_t), head = n;
#ifdef CYPOOL_STREAM_VEC
    head = (64 - (uintptr_t)dst % 64) % 64 / size;  /* dst is size-aligned */
    if (head > n) head = n;
#endif
    cypool_plain_copy((char *)dst, src, head, wide);
    p->dst = (char *)dst + head * size;
    p->src = src + head;
    p->left = n - head;
    p->wide = wide;
}

/* Streams the next whole line of q, if any is left; returns whether it
 * did. Without streaming stores cypool_pending_start leaves no whole line
 * pending, so this never fires there. One call per iteration of a flat
 * 3x3 pass. */
static inline int cypool_pending_step(cypool_pending *q)
{
    size_t per = q->wide ? 8 : 16;
    if (q->left < per)
        return 0;
    cypool_stream_line(q->dst, q->src, q->wide);
    q->dst += 64; q->src += per; q->left -= per;
    return 1;
}

static inline void cypool_pending_finish(cypool_pending *p)
{
    cypool_pending q = *p;  /* in registers: the stores could alias *p */
    while (cypool_pending_step(&q))
        ;
    cypool_plain_copy(q.dst, q.src, q.left, q.wide);
    p->left = 0;
}

/* The two passes of the flat 3x3 max pool for float32 planes without NaN
 * and int32 indices (_flat3_h_fast and _flat3_v_fast in
 * cypool/_maxpool_flat3.pxi, same results). Each streams a line of the pending
 * plane an iteration while lines are left (cypool_pending_step), so the
 * stores drain while the plane is pooled instead of stalling the core in
 * one burst. A plane of int64 indices has about as many lines as a pass
 * has iterations, so the horizontal pass carries nearly all of them
 * (docs/performance.md compares the schedules). MAXPS computes v > m ? v : m and MINPS a < c ? a : c, exactly as the
 * Cython loops do. */
#if defined(__AVX2__)
#define CYPOOL_FLAT3_SIMD 1
/* Horizontal pass over flat positions [lo, hi), 0 < lo, hi < H*W; returns
 * whether some x[p] there is NaN (then the results are wrong). */
static inline int cypool_flat3_h_f32(const float *x, const float *lcap, const float *rcap,
                                     float *hv, int32_t *hc, ptrdiff_t lo, ptrdiff_t hi,
                                     cypool_pending *pend)
{
    cypool_pending q = *pend;
    const __m256 low = _mm256_set1_ps(-INFINITY);
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i q0 = _mm256_add_epi32(_mm256_set1_epi32((int32_t)lo),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i q1 = _mm256_add_epi32(q0, _mm256_set1_epi32(1));
    __m256 nan = _mm256_setzero_ps();
    ptrdiff_t p = lo;
    for (; p + 8 <= hi; p += 8) {
        __m256 c = _mm256_loadu_ps(x + p), cap = _mm256_loadu_ps(lcap + p);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
        /* The left tap capped (-inf in the left padding), with its index, or
         * the centre's there (the mask is -1 where the left tap is in). */
        __m256 m = _mm256_min_ps(_mm256_loadu_ps(x + p - 1), cap);
        __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(
            q0, _mm256_castps_si256(_mm256_cmp_ps(cap, low, _CMP_GT_OQ))));
        __m256 t = _mm256_cmp_ps(c, m, _CMP_GT_OQ);
        k = _mm256_blendv_ps(k, _mm256_castsi256_ps(q0), t);
        m = _mm256_max_ps(c, m);
        __m256 b = _mm256_min_ps(_mm256_loadu_ps(x + p + 1), _mm256_loadu_ps(rcap + p));
        t = _mm256_cmp_ps(b, m, _CMP_GT_OQ);
        _mm256_storeu_ps((float *)(hc + p), _mm256_blendv_ps(k, _mm256_castsi256_ps(q1), t));
        _mm256_storeu_ps(hv + p, _mm256_max_ps(b, m));
        q0 = _mm256_add_epi32(q0, eight);
        q1 = _mm256_add_epi32(q1, eight);
        cypool_pending_step(&q);
    }
    int any = _mm256_movemask_ps(nan) != 0;
    for (; p < hi; p++) {
        float c = x[p], cap = lcap[p], a = x[p - 1], m = a < cap ? a : cap, b;
        int32_t k = (int32_t)p - (cap > -INFINITY);
        any |= c != c;
        k = c > m ? (int32_t)p : k;
        m = c > m ? c : m;
        b = x[p + 1];
        cap = rcap[p];
        b = b < cap ? b : cap;
        hc[p] = b > m ? (int32_t)p + 1 : k;
        hv[p] = b > m ? b : m;
    }
    *pend = q;
    return any;
}

/* Vertical pass over the H + 2 rows of horizontal results (padding rows
 * first and last), writing n = H * W outputs. */
static inline void cypool_flat3_v_f32(const float *hv, const int32_t *hc, float *op,
                                      int32_t *ip, ptrdiff_t n, ptrdiff_t W,
                                      cypool_pending *pend)
{
    cypool_pending q = *pend;  /* in registers for the loop */
    ptrdiff_t p = 0;
    for (; p + 8 <= n; p += 8) {
        __m256 m = _mm256_loadu_ps(hv + p);
        __m256 k = _mm256_loadu_ps((const float *)(hc + p));
        __m256 v = _mm256_loadu_ps(hv + p + W);
        __m256 t = _mm256_cmp_ps(v, m, _CMP_GT_OQ);
        k = _mm256_blendv_ps(k, _mm256_loadu_ps((const float *)(hc + p + W)), t);
        m = _mm256_max_ps(v, m);
        v = _mm256_loadu_ps(hv + p + 2 * W);
        t = _mm256_cmp_ps(v, m, _CMP_GT_OQ);
        k = _mm256_blendv_ps(k, _mm256_loadu_ps((const float *)(hc + p + 2 * W)), t);
        _mm256_storeu_ps(op + p, _mm256_max_ps(v, m));
        _mm256_storeu_ps((float *)(ip + p), k);
        cypool_pending_step(&q);
    }
    for (; p < n; p++) {
        float m = hv[p], v = hv[p + W];
        int32_t k = v > m ? hc[p + W] : hc[p];
        m = v > m ? v : m;
        v = hv[p + 2 * W];
        ip[p] = v > m ? hc[p + 2 * W] : k;
        op[p] = v > m ? v : m;
    }
    *pend = q;
}
#else
#define CYPOOL_FLAT3_SIMD 0
static inline int cypool_flat3_h_f32(const float *x, const float *lcap, const float *rcap,
                                     float *hv, int32_t *hc, ptrdiff_t lo, ptrdiff_t hi,
                                     cypool_pending *pend)
{
    (void)x; (void)lcap; (void)rcap; (void)hv; (void)hc; (void)lo; (void)hi; (void)pend;
    return 1;  /* never called */
}
static inline void cypool_flat3_v_f32(const float *hv, const int32_t *hc, float *op,
                                      int32_t *ip, ptrdiff_t n, ptrdiff_t W,
                                      cypool_pending *pend)
{
    (void)hv; (void)hc; (void)op; (void)ip; (void)n; (void)W; (void)pend;  /* never called */
}
#endif

static inline void cypool_stream_fence(void)
{
#ifdef CYPOOL_STREAM_VEC
    _mm_sfence();
#endif
}

#endif
