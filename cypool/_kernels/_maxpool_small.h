/* The window scan of the small-plane max pool (_maxpool_small.pxi), written
 * once with GCC vector types of each variant's width: 16 planes are one
 * AVX-512 vector of float32, two AVX2 ones or four SSE2 ones.
 * (Cython's generated loop stayed scalar: gcc would not if-convert it.)
 *
 * buf holds element i of plane b at buf[i * 16 + b]; for each output
 * position o, the scan starts from its first tap and takes each later tap
 * where takes_over() would: a larger value, or a NaN over a number; the
 * tap's plane offset is the index. best/code get 16 lanes per position.
 *
 * The moves into and out of that layout, for 4-byte values and the int32
 * codes, are transposes of 8x8 blocks in AVX2 registers (x86-64-v3 and v4
 * builds): element by element they cost more than the scan itself.
 */
#ifndef CYPOOL_MAXPOOL_SMALL_H
#define CYPOOL_MAXPOOL_SMALL_H

#include <stdint.h>
#include <string.h>
#include <Python.h>

#define CYPOOL_SMALL_LANES 16

/* The target's vector width; the 16 lanes are 16 * sizeof(T) / VBYTES of
 * its vectors, scanned side by side: generic vectors wider than the
 * target's are lowered to scalar compares and selects (docs/performance.md). */
#if defined(__AVX512F__)
#define CYPOOL_SMALL_VBYTES 64
#elif defined(__AVX2__)
#define CYPOOL_SMALL_VBYTES 32
#else
#define CYPOOL_SMALL_VBYTES 16
#endif

#define CYPOOL_SMALL_SCAN(NAME, T, M)                                              \
typedef T NAME##_vt __attribute__((vector_size(CYPOOL_SMALL_VBYTES)));            \
typedef M NAME##_mt __attribute__((vector_size(CYPOOL_SMALL_VBYTES)));            \
static inline void NAME(const T* buf, T* best, int32_t* code, const int32_t* taps, \
                        const int32_t* ntaps, Py_ssize_t T_, Py_ssize_t n_out)     \
{                                                                                  \
    enum { W = CYPOOL_SMALL_VBYTES / sizeof(T), NV = 16 / W };                     \
    for (Py_ssize_t o = 0; o < n_out; o++) {                                       \
        const int32_t* tp = taps + o * T_;                                         \
        NAME##_vt m[NV], v;                                                        \
        NAME##_mt k[NV];                                                           \
        int32_t off = tp[0];                                                       \
        for (int h = 0; h < NV; h++) {                                             \
            memcpy(&m[h], buf + (Py_ssize_t)off * 16 + h * W, sizeof v);           \
            k[h] = (NAME##_mt){0} + off;                                           \
        }                                                                          \
        for (int32_t t = 1; t < ntaps[o]; t++) {                                   \
            off = tp[t];                                                           \
            for (int h = 0; h < NV; h++) {                                         \
                memcpy(&v, buf + (Py_ssize_t)off * 16 + h * W, sizeof v);          \
                NAME##_mt take = (m[h] == m[h]) & ~(v <= m[h]);                    \
                m[h] = (NAME##_vt)(((NAME##_mt)v & take) | ((NAME##_mt)m[h] & ~take)); \
                k[h] = (k[h] & ~take) | (((NAME##_mt){0} + off) & take);           \
            }                                                                      \
        }                                                                          \
        for (int h = 0; h < NV; h++) {                                             \
            memcpy(best + o * 16 + h * W, &m[h], sizeof v);                        \
            for (int l = 0; l < W; l++)                                            \
                code[o * 16 + h * W + l] = (int32_t)k[h][l];                       \
        }                                                                          \
    }                                                                              \
}

/* buf[i * 16 + b] = x[min(b, nb - 1) * HW + i] for b < 16, i < HW: 16
 * planes of 4-byte elements, planes innermost (lanes past nb repeat the
 * last plane). */
static inline void cypool_small_in_4(const void* xv, Py_ssize_t nb, Py_ssize_t HW, void* bufv);
/* dst[b * n_out + o] = src[o * 16 + b] for b < nb, o < n_out: back to the
 * planes, 4-byte elements (values, or int32 codes to int32 indices). */
static inline void cypool_small_out_4(const void* srcv, Py_ssize_t nb, Py_ssize_t n_out,
                                      void* dstv);
/* The same from int32 codes to int64 indices. */
static inline void cypool_small_out_i64(const int32_t* src, Py_ssize_t nb, Py_ssize_t n_out,
                                        int64_t* dst);

#if defined(__AVX2__)
#include <immintrin.h>

/* r[j] = element j of rows r[0..7] (an 8x8 transpose of 4-byte lanes). */
static inline void cypool_tr8x8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);     /* a0 b0 a1 b1 */
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]); /* a2 b2 a3 b3 */
    }
    for (int g = 0; g < 2; g++) {
        __m256 *tg = t + 4 * g, *ug = u + 4 * g;
        ug[0] = _mm256_shuffle_ps(tg[0], tg[2], _MM_SHUFFLE(1, 0, 1, 0)); /* a0 b0 c0 d0 */
        ug[1] = _mm256_shuffle_ps(tg[0], tg[2], _MM_SHUFFLE(3, 2, 3, 2));
        ug[2] = _mm256_shuffle_ps(tg[1], tg[3], _MM_SHUFFLE(1, 0, 1, 0));
        ug[3] = _mm256_shuffle_ps(tg[1], tg[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);     /* 128-bit lane 0 */
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31); /* lane 1 */
    }
}

/* The first n of 8 lanes. */
static inline __m256i cypool_first_lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline void cypool_small_in_4(const void* xv, Py_ssize_t nb, Py_ssize_t HW, void* bufv)
{
    const float* x = (const float*)xv;
    float* buf = (float*)bufv;
    /* The next block of 16 planes (HW lines of 64 bytes), which the read
     * order here, 16 short streams, hides from the hardware prefetcher.
     * Past the array's end a prefetch is a no-op. */
    const char* next = (const char*)(x + 16 * HW);
    for (Py_ssize_t i0 = 0; i0 < HW; i0 += 8) {
        int n = HW - i0 < 8 ? (int)(HW - i0) : 8;
        __m256i m = cypool_first_lanes(n);
        for (int k = 0; k < n; k++)
            _mm_prefetch(next + (i0 + k) * 64, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int b = 0; b < 8; b++) {
                const float* src = x + (h * 8 + b < nb ? h * 8 + b : nb - 1) * HW + i0;
                r[b] = n == 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, m);
            }
            cypool_tr8x8(r);
            for (int i = 0; i < n; i++)
                _mm256_storeu_ps(buf + (i0 + i) * 16 + h * 8, r[i]);
        }
    }
}

/* Rows o0 .. o0+n-1 (n <= 8) of src, planes h*8 .. h*8+7, transposed:
 * r[b] holds plane h*8+b's values at those positions (lanes past n: 0). */
static inline void cypool_small_rows_t(const float* src, Py_ssize_t o0, int n, int h,
                                       __m256 r[8])
{
    for (int k = 0; k < 8; k++)
        r[k] = k < n ? _mm256_loadu_ps(src + (o0 + k) * 16 + h * 8) : _mm256_setzero_ps();
    cypool_tr8x8(r);
}

static inline void cypool_small_out_4(const void* srcv, Py_ssize_t nb, Py_ssize_t n_out,
                                      void* dstv)
{
    const float* src = (const float*)srcv;
    float* dst = (float*)dstv;
    for (Py_ssize_t o0 = 0; o0 < n_out; o0 += 8) {
        int n = n_out - o0 < 8 ? (int)(n_out - o0) : 8;
        __m256i m = cypool_first_lanes(n);
        for (int h = 0; h * 8 < nb; h++) {
            __m256 r[8];
            cypool_small_rows_t(src, o0, n, h, r);
            for (int b = 0; b < 8 && h * 8 + b < nb; b++) {
                float* d = dst + (h * 8 + b) * n_out + o0;
                if (n == 8)
                    _mm256_storeu_ps(d, r[b]);
                else
                    _mm256_maskstore_ps(d, m, r[b]);
            }
        }
    }
}

static inline void cypool_small_out_i64(const int32_t* src, Py_ssize_t nb, Py_ssize_t n_out,
                                        int64_t* dst)
{
    for (Py_ssize_t o0 = 0; o0 < n_out; o0 += 8) {
        int n = n_out - o0 < 8 ? (int)(n_out - o0) : 8;
        /* 64-bit lanes: the first n of two halves of 4 */
        __m256i m_lo = _mm256_cvtepi32_epi64(_mm_cmpgt_epi32(_mm_set1_epi32(n),
                                                             _mm_setr_epi32(0, 1, 2, 3)));
        __m256i m_hi = _mm256_cvtepi32_epi64(_mm_cmpgt_epi32(_mm_set1_epi32(n),
                                                             _mm_setr_epi32(4, 5, 6, 7)));
        for (int h = 0; h * 8 < nb; h++) {
            __m256 r[8];
            cypool_small_rows_t((const float*)src, o0, n, h, r);
            for (int b = 0; b < 8 && h * 8 + b < nb; b++) {
                __m256i c = _mm256_castps_si256(r[b]);
                __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(c));
                __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(c, 1));
                long long* d = (long long*)(dst + (h * 8 + b) * n_out + o0);
                if (n == 8) {
                    _mm256_storeu_si256((__m256i*)d, lo);
                    _mm256_storeu_si256((__m256i*)(d + 4), hi);
                } else {
                    _mm256_maskstore_epi64(d, m_lo, lo);
                    if (n > 4)
                        _mm256_maskstore_epi64(d + 4, m_hi, hi);
                }
            }
        }
    }
}

#else /* element by element */

static inline void cypool_small_in_4(const void* xv, Py_ssize_t nb, Py_ssize_t HW, void* bufv)
{
    const int32_t* x = (const int32_t*)xv;
    int32_t* buf = (int32_t*)bufv;
    for (Py_ssize_t b = 0; b < 16; b++) {
        const int32_t* src = x + (b < nb ? b : nb - 1) * HW;
        for (Py_ssize_t i = 0; i < HW; i++)
            buf[i * 16 + b] = src[i];
    }
}

static inline void cypool_small_out_4(const void* srcv, Py_ssize_t nb, Py_ssize_t n_out,
                                      void* dstv)
{
    const int32_t* src = (const int32_t*)srcv;
    int32_t* dst = (int32_t*)dstv;
    for (Py_ssize_t b = 0; b < nb; b++)
        for (Py_ssize_t o = 0; o < n_out; o++)
            dst[b * n_out + o] = src[o * 16 + b];
}

static inline void cypool_small_out_i64(const int32_t* src, Py_ssize_t nb, Py_ssize_t n_out,
                                        int64_t* dst)
{
    for (Py_ssize_t b = 0; b < nb; b++)
        for (Py_ssize_t o = 0; o < n_out; o++)
            dst[b * n_out + o] = src[o * 16 + b];
}
#endif

CYPOOL_SMALL_SCAN(cypool_small_scan_f32, float, int32_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_f64, double, int64_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_i32, int32_t, int32_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_i64, int64_t, int64_t)

#endif
