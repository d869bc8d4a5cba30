/* The window scan of the small-plane max pool (_maxpool_small.pxi), written
 * once with GCC vector types of each variant's width: 16 planes are one
 * AVX-512 vector of float32, two AVX2 ones or four SSE2 ones.
 * (Cython's generated loop stayed scalar: gcc would not if-convert it.)
 *
 * buf holds element i of plane b at buf[i * 16 + b]; for each output
 * position o, the scan starts from its first tap and takes each later tap
 * where takes_over() would: a larger value, or a NaN over a number; the
 * tap's plane offset is the index. best/code get 16 lanes per position.
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

CYPOOL_SMALL_SCAN(cypool_small_scan_f32, float, int32_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_f64, double, int64_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_i32, int32_t, int32_t)
CYPOOL_SMALL_SCAN(cypool_small_scan_i64, int64_t, int64_t)

#endif
