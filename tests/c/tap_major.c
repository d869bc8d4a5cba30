/* The tap-major weight copy of cypool/_kernels/_tap_major.h against a plain loop:
 * both dtypes, forward and transposed, 1-9 channels each way, kernels of
 * 1-5 x 1-5 taps, zero padding of the output channels, and weights read
 * through every kind of stride: C-contiguous (the 4 x 4 and 2 x 2 blocks),
 * gaps between rows or channels, reversed axes (negative strides), and
 * taps not side by side (one value at a time); and the taps' vectors
 * transposed into im2col rows (cypool_tap_rows_*). Built by
 * tests/test_kernel_headers.py once per vector width. Exits 1 on a wrong
 * value. */
#include <stdio.h>
#include <stdlib.h>
#include "_tap_major.h"

#define CHECK(T, SUF)                                                                \
static int check_##SUF(void) {                                                       \
    int bad = 0;                                                                     \
    for (int trial = 0; trial < 3000; trial++) {                                     \
        ptrdiff_t shape[4] = {1 + rand() % 9, 1 + rand() % 9, 1 + rand() % 5, 1 + rand() % 5}; \
        int transposed = rand() % 2, layout = rand() % 4;                            \
        ptrdiff_t isz = sizeof(T), e[4], st[4], n = 1;                               \
        /* element strides: C order with optional gaps */                            \
        e[3] = layout == 3 ? 2 : 1;                                                  \
        e[2] = e[3] * shape[3] + (layout == 1 ? rand() % 3 : 0);                     \
        e[1] = e[2] * shape[2] + (layout == 1 ? rand() % 3 : 0);                     \
        e[0] = e[1] * shape[1] + (layout >= 1 ? rand() % 3 : 0);                     \
        n = e[0] * shape[0];                                                         \
        T *buf = malloc(n * sizeof(T));                                              \
        for (ptrdiff_t i = 0; i < n; i++) buf[i] = (T)(i + 1);                       \
        const char *base = (const char *)buf;                                        \
        for (int d = 0; d < 4; d++) {                                                \
            st[d] = e[d] * isz;                                                      \
            if (layout == 2 && rand() % 2) { /* this axis reversed */                \
                base += (shape[d] - 1) * st[d];                                      \
                st[d] = -st[d];                                                      \
            }                                                                        \
        }                                                                            \
        ptrdiff_t R = transposed ? shape[0] : shape[1], Oc = transposed ? shape[1] : shape[0]; \
        ptrdiff_t kh = shape[2], kw = shape[3], ldt = Oc + rand() % 6;               \
        ptrdiff_t K = R * kh * kw;                                                   \
        T *wt = malloc(K * ldt * sizeof(T));                                         \
        for (ptrdiff_t i = 0; i < K * ldt; i++) wt[i] = -7;                          \
        cypool_tap_major_##SUF(base, shape, st, transposed, ldt, wt);                \
        for (ptrdiff_t r = 0; r < R; r++)                                            \
            for (ptrdiff_t i = 0; i < kh; i++)                                       \
                for (ptrdiff_t j = 0; j < kw; j++)                                   \
                    for (ptrdiff_t o = 0; o < ldt; o++) {                            \
                        ptrdiff_t t = (r * kh + i) * kw + j;                         \
                        T want = 0;                                                  \
                        if (o < Oc) {                                                \
                            ptrdiff_t a = transposed ? r : o, b = transposed ? o : r; \
                            ptrdiff_t ii = transposed ? kh - 1 - i : i;              \
                            ptrdiff_t jj = transposed ? kw - 1 - j : j;              \
                            want = *(const T *)(base + a * st[0] + b * st[1]         \
                                                + ii * st[2] + jj * st[3]);          \
                        }                                                            \
                        if (wt[t * ldt + o] != want) {                               \
                            if (bad < 5) printf(#SUF " shape %td %td %td %td layout %d" \
                                " transposed %d ldt %td: t=%td o=%td %g != %g\n",   \
                                shape[0], shape[1], kh, kw, layout, transposed, ldt, \
                                t, o, (double)wt[t * ldt + o], (double)want);        \
                            bad++;                                                   \
                        }                                                            \
                    }                                                                \
        free(buf);                                                                   \
        free(wt);                                                                    \
    }                                                                                \
    return bad;                                                                      \
}
CHECK(float, f32)
CHECK(double, f64)

/* cypool_tap_rows_*: K taps at any offsets (repeated, out of order), n
 * positions, every remainder of both against the blocks. */
#define CHECK_ROWS(T, SUF)                                                           \
static int check_rows_##SUF(void) {                                                  \
    int bad = 0;                                                                     \
    for (int trial = 0; trial < 3000; trial++) {                                     \
        ptrdiff_t K = 1 + rand() % 23, n = 1 + rand() % 41, span = 64;               \
        T *base = malloc((span + n) * sizeof(T)), *out = malloc(n * K * sizeof(T));  \
        ptrdiff_t *off = malloc(K * sizeof(ptrdiff_t));                              \
        for (ptrdiff_t i = 0; i < span + n; i++) base[i] = (T)(i * 3 + 1);          \
        for (ptrdiff_t k = 0; k < K; k++) off[k] = rand() % span;                    \
        cypool_tap_rows_##SUF(base, off, K, n, out);                                 \
        for (ptrdiff_t e = 0; e < n; e++)                                            \
            for (ptrdiff_t k = 0; k < K; k++)                                        \
                if (out[e * K + k] != base[off[k] + e]) {                            \
                    if (bad < 5) printf(#SUF " rows K=%td n=%td: e=%td k=%td %g != %g\n", \
                                        K, n, e, k, (double)out[e * K + k],          \
                                        (double)base[off[k] + e]);                   \
                    bad++;                                                           \
                }                                                                    \
        free(base);                                                                  \
        free(out);                                                                   \
        free(off);                                                                   \
    }                                                                                \
    return bad;                                                                      \
}
CHECK_ROWS(float, f32)
CHECK_ROWS(double, f64)

int main(void)
{
    srand(7);
    int bad = check_f32() + check_f64() + check_rows_f32() + check_rows_f64();
    printf("tap_major: %s (%d bad)\n", bad ? "FAILED" : "ok", bad);
    return bad != 0;
}
