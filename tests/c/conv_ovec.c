/* The forward with output channels in the vector lanes
 * (cypool/_kernels/_conv_ovec.h) against a plain loop: 1-40 output channels
 * (one vector, two, several, and a part of one, the weights' rows padded
 * with zeros), rows of 1-60 outputs (every tile width, rows cut into
 * pieces), column strides 1 and 2, row steps of 1-3 rows, dilated taps,
 * bias or none, outputs written through channel, row and column strides,
 * and a row range starting past row 0. The blocked weights' buffer, the
 * scratch row and the output are poisoned with NaN, and the output's gaps
 * must stay NaN. Built
 * by tests/test_kernel_headers.py once per vector width, the AVX-512 layout
 * included. Exits 1 on a wrong value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "_conv_ovec.h"

#define CHECK(T, SUF, TOL)                                                           \
static int check_##SUF(void) {                                                       \
    int bad = 0;                                                                     \
    const ptrdiff_t L = CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T);                     \
    for (int trial = 0; trial < 1500; trial++) {                                     \
        ptrdiff_t C = 1 + rand() % 4, O = 1 + rand() % 40, kh = 1 + rand() % 4;     \
        ptrdiff_t kw = 1 + rand() % 4, dh = 1 + rand() % 2, dw = 1 + rand() % 2;     \
        ptrdiff_t sw = 1 + rand() % 2, sh = 1 + rand() % 3, usebias = rand() % 2;    \
        ptrdiff_t OH = 1 + rand() % 5, OW = 1 + rand() % (rand() % 4 ? 16 : 60);     \
        ptrdiff_t oy0 = rand() % OH;                                                 \
        ptrdiff_t Op = (O + L - 1) / L * L, K = C * kh * kw;                         \
        ptrdiff_t Wq = (OW - 1) * sw + (kw - 1) * dw + 1 + rand() % 3;               \
        ptrdiff_t Hq = (OH - 1) * sh + (kh - 1) * dh + 1, plane = Hq * Wq;           \
        ptrdiff_t so_w = 1 + rand() % 2, so_h = OW * so_w + rand() % 3;              \
        ptrdiff_t so_c = OH * so_h + rand() % 3;                                     \
        T *img = malloc(C * plane * sizeof(T)), *w = malloc(K * Op * sizeof(T));     \
        T *bias = malloc(O * sizeof(T)), *out = malloc(O * so_c * sizeof(T));        \
        T *wb = malloc(K * Op * sizeof(T));                                          \
        T *s = malloc(Op * CYPOOL_OV_LDS(OW) * sizeof(T));                           \
        ptrdiff_t *off = malloc(K * sizeof(ptrdiff_t));                              \
        for (ptrdiff_t i = 0; i < C * plane; i++) img[i] = (T)((rand() % 2001) - 1000) / 300; \
        for (ptrdiff_t t = 0; t < K; t++)                                            \
            for (ptrdiff_t o = 0; o < Op; o++)                                       \
                w[t * Op + o] = o < O ? (T)((rand() % 2001) - 1000) / 700 : 0;       \
        for (ptrdiff_t o = 0; o < O; o++) bias[o] = (T)(rand() % 11) - 5;            \
        for (ptrdiff_t i = 0; i < O * so_c; i++) out[i] = NAN;                       \
        for (ptrdiff_t i = 0; i < K * Op; i++) wb[i] = NAN;                          \
        for (ptrdiff_t i = 0; i < Op * CYPOOL_OV_LDS(OW); i++) s[i] = NAN;           \
        for (ptrdiff_t c = 0, t = 0; c < C; c++)                                     \
            for (ptrdiff_t i = 0; i < kh; i++)                                       \
                for (ptrdiff_t j = 0; j < kw; j++, t++)                              \
                    off[t] = c * plane + i * dh * Wq + j * dw;                       \
        cypool_ov_block_##SUF(w, K, Op, wb);                                         \
        cypool_ov_rows_##SUF(img, off, K, wb, Op, O, oy0, OH, OW, sh * Wq, sw,       \
                             usebias ? bias : NULL, s, out, so_c, so_h, so_w,        \
                             (const char *)img, Wq * (ptrdiff_t)sizeof(T),           \
                             plane * (ptrdiff_t)sizeof(T), C);                       \
        for (ptrdiff_t o = 0; o < O; o++)                                            \
            for (ptrdiff_t oy = 0; oy < OH; oy++)                                    \
                for (ptrdiff_t ox = 0; ox < OW; ox++) {                              \
                    T got = out[o * so_c + oy * so_h + ox * so_w];                   \
                    if (oy < oy0) { /* rows before the range stay untouched */       \
                        if (!isnan(got)) bad++;                                      \
                        continue;                                                    \
                    }                                                                \
                    double want = usebias ? bias[o] : 0;                             \
                    for (ptrdiff_t t = 0; t < K; t++)                                \
                        want += (double)w[t * Op + o]                                \
                                * img[off[t] + oy * sh * Wq + ox * sw];              \
                    if (!(fabs(got - want) <= TOL * (1 + fabs(want)))) {             \
                        if (bad < 5) printf(#SUF " C %td O %td k %tdx%td d %td,%td"  \
                            " s %td,%td OW %td: o=%td oy=%td ox=%td %g != %g\n",     \
                            C, O, kh, kw, dh, dw, sh, sw, OW, o, oy, ox,             \
                            (double)got, want);                                      \
                        bad++;                                                       \
                    }                                                                \
                }                                                                    \
        /* nothing written outside the outputs: the gaps between them */           \
        ptrdiff_t written = 0;                                                       \
        for (ptrdiff_t i = 0; i < O * so_c; i++) written += !isnan(out[i]);          \
        if (written != O * (OH - oy0) * OW) {                                        \
            if (bad < 5) printf(#SUF " O %td OW %td: %td values written, not %td\n", \
                                O, OW, written, O * (OH - oy0) * OW);               \
            bad++;                                                                   \
        }                                                                            \
        free(img); free(w); free(bias); free(out); free(wb); free(s);                \
        free(off);                                                                   \
    }                                                                                \
    printf(#SUF ": %s (%d bad)\n", bad ? "WRONG" : "ok", bad);                       \
    return bad;                                                                      \
}
CHECK(float, f32, 1e-4)
CHECK(double, f64, 1e-10)

int main(void) {
    srand(11);
    return (check_f32() + check_f64()) ? 1 : 0;
}
