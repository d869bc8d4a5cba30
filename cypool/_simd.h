/* The loops gcc does not vectorise well from Cython, written with
 * intrinsics: the chunk maximum of the argmax kernel (cypool/_argmax.pxi)
 * and, at the end, the streaming copy of the max-pool indices.
 *
 * gcc 12 does not vectorise a NaN-aware max over lanes written in Cython, so
 * this one loop is written with intrinsics: AVX2 in the x86-64-v3 build,
 * SSE2 in the x86-64 baseline build. MAXPS
 * computes exactly v > m ? v : m, and CMPUNORDPS flags NaN. Other targets
 * get the plain loop. Returns 1 if x[:n] holds a NaN; *out gets the maximum
 * of the non-NaN values (or -inf). cypool_first_* finds the position a
 * chunk's maximum (or first NaN) came from, four or two lanes at a time.
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
 * speed is that of memory: prefetching 4 KiB ahead (the best of 1, 2, 4 and
 * 8 KiB measured here) took the [32, 245, 64, 64] argmax from 1.03x to 0.84x
 * of torch.amax's time. Each loop iteration reads 64 or 128 bytes. */
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
/* Non-temporal copy, for outputs written once and not read again soon
 * (max-pool indices: only the backward pass reads them). The stores skip
 * the cache: they do not read the destination lines first, and they do not
 * evict what the next layer reads. Only whole 64-byte lines are streamed;
 * the partial lines at both ends take plain stores (a line written both
 * ways is flushed half-written). The streamed bytes are visible to other
 * threads only after cypool_stream_fence(), which each thread calls once
 * after its last copy (a fence per copy serialises the stores). */
#if defined(__AVX2__)
#define CYPOOL_STREAM_VEC 32
#define CYPOOL_STREAM_STORE(d, s) \
    _mm256_stream_si256((__m256i *)(d), _mm256_loadu_si256((const __m256i *)(s)))
#elif defined(__SSE2__) || defined(_M_X64)
#define CYPOOL_STREAM_VEC 16
#define CYPOOL_STREAM_STORE(d, s) \
    _mm_stream_si128((__m128i *)(d), _mm_loadu_si128((const __m128i *)(s)))
#endif
static inline void cypool_stream_copy(void *dst, const void *src, size_t n)
{
#ifdef CYPOOL_STREAM_VEC
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (64 - (uintptr_t)d % 64) % 64, v;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64)
        for (v = 0; v < 64; v += CYPOOL_STREAM_VEC)
            CYPOOL_STREAM_STORE(d + v, s + v);
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

/* dst[i] = src[i] for i < n, int32 to int64, streaming the whole 64-byte
 * lines of dst as cypool_stream_copy does. */
static inline void cypool_stream_widen(int64_t *dst, const int32_t *src, size_t n)
{
    size_t i = 0;
#ifdef CYPOOL_STREAM_VEC
    for (; i < n && (uintptr_t)(dst + i) % 64 != 0; i++)
        dst[i] = src[i];
    for (; i + 8 <= n; i += 8) {
#if defined(__AVX2__)
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 4));
        _mm256_stream_si256((__m256i *)(dst + i), _mm256_cvtepi32_epi64(a));
        _mm256_stream_si256((__m256i *)(dst + i + 4), _mm256_cvtepi32_epi64(b));
#else
        for (size_t h = 0; h < 8; h += 4) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + i + h));
            __m128i sign = _mm_srai_epi32(a, 31);
            _mm_stream_si128((__m128i *)(dst + i + h), _mm_unpacklo_epi32(a, sign));
            _mm_stream_si128((__m128i *)(dst + i + h + 2), _mm_unpackhi_epi32(a, sign));
        }
#endif
    }
#endif
    for (; i < n; i++)
        dst[i] = src[i];
}

static inline void cypool_stream_fence(void)
{
#ifdef CYPOOL_STREAM_VEC
    _mm_sfence();
#endif
}

#endif
