/* The forward by F(2, 3) along the rows (cypool/_kernels/_conv_winograd.h)
 * against a plain loop: 1-40 output channels (one vector, two, several, a
 * part of one), rows of 2-61 outputs, odd and even (every tile width of
 * the pairs), 1-5 kernel rows, row steps of 1-3 rows, row dilation, bias
 * or none, outputs written through channel, row and column strides, and a
 * row range starting past row 0. Some trials put inf or NaN in the image,
 * or a pair of values whose transformed sums overflow: those rows must
 * come out as the direct sums do. The scratch, the transformed rows and
 * the output are poisoned with NaN, and the output's gaps must stay NaN.
 * Built by tests/test_kernel_headers.py once per vector width, the
 * AVX-512 layout included. Exits 1 on a wrong value. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "_conv_winograd.h"

#define CHECK(T, SUF, TOL, BIG)                                                      \
static int check_##SUF(void) {                                                       \
    int bad = 0;                                                                     \
    const ptrdiff_t L = CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T);                     \
    for (int trial = 0; trial < 1500; trial++) {                                     \
        ptrdiff_t C = 1 + rand() % 6, O = 1 + rand() % 40, kh = 1 + rand() % 5;     \
        ptrdiff_t dh = 1 + rand() % 2, sh = 1 + rand() % 3, usebias = rand() % 2;    \
        ptrdiff_t OH = 1 + rand() % 5, OW = 2 + rand() % (rand() % 4 ? 16 : 60);     \
        ptrdiff_t oy0 = rand() % OH, special = rand() % 4;                           \
        ptrdiff_t Op = (O + L - 1) / L * L, K1 = C * kh, K = 3 * K1;                 \
        ptrdiff_t P = (OW + 1) / 2;                                                  \
        ptrdiff_t Wq = OW + 2, R = (OH - 1) * sh + (kh - 1) * dh + 1;                \
        ptrdiff_t plane = R * Wq;                                                    \
        ptrdiff_t so_w = 1 + rand() % 2, so_h = OW * so_w + rand() % 3;              \
        ptrdiff_t so_c = OH * so_h + rand() % 3;                                     \
        T *img = malloc((C * plane + 64) * sizeof(T));                               \
        T *w = malloc(K * Op * sizeof(T));                                           \
        T *wb = malloc(K * Op * sizeof(T)), *g = malloc(4 * K1 * Op * sizeof(T));   \
        T *u = malloc(4 * C * R * P * sizeof(T));                                    \
        T *bias = malloc(O * sizeof(T)), *out = malloc(O * so_c * sizeof(T));        \
        T *s = malloc(CYPOOL_WG_SCRATCH(Op, OW) * sizeof(T));                        \
        ptrdiff_t *off = malloc(K * sizeof(ptrdiff_t));                              \
        ptrdiff_t *offw = malloc(K1 * sizeof(ptrdiff_t));                            \
        for (ptrdiff_t i = 0; i < C * plane + 64; i++)                               \
            img[i] = (T)((rand() % 2001) - 1000) / 300;                              \
        if (special == 1) img[rand() % (C * plane)] = INFINITY;                      \
        if (special == 2) img[rand() % (C * plane)] = NAN;                           \
        if (special == 3) { /* at columns 2m + 1, 2m + 2: their sum overflows */    \
            ptrdiff_t at = rand() % (C * R) * Wq + 1 + 2 * (rand() % P);             \
            img[at] = img[at + 1] = BIG; }                                           \
        /* positive where a huge pair is, so no huge terms cancel */                 \
        for (ptrdiff_t t = 0; t < K; t++)                                            \
            for (ptrdiff_t o = 0; o < Op; o++)                                       \
                w[t * Op + o] = o >= O ? 0                                           \
                    : (T)((rand() % 2001) - (special == 3 ? 0 : 1000)) / 700000;     \
        for (ptrdiff_t o = 0; o < O; o++) bias[o] = (T)(rand() % 11) - 5;            \
        for (ptrdiff_t i = 0; i < O * so_c; i++) out[i] = NAN;                       \
        for (ptrdiff_t i = 0; i < CYPOOL_WG_SCRATCH(Op, OW); i++) s[i] = NAN;        \
        for (ptrdiff_t i = 0; i < 4 * C * R * P; i++) u[i] = NAN;                    \
        for (ptrdiff_t c = 0, t = 0; c < C; c++)                                     \
            for (ptrdiff_t i = 0; i < kh; i++) {                                     \
                offw[c * kh + i] = (c * R + i * dh) * P;                             \
                for (ptrdiff_t j = 0; j < 3; j++, t++)                               \
                    off[t] = c * plane + i * dh * Wq + j;                            \
            }                                                                        \
        cypool_ov_block_##SUF(w, K, Op, wb);                                         \
        if (cypool_wg_weights_##SUF(w, K1, Op, g)) {                                 \
            printf(#SUF " finite weights reported as not\n");                        \
            bad++;                                                                   \
        }                                                                            \
        cypool_wg_input_##SUF(img, C, R, Wq, P, u);                                  \
        cypool_wg_rows_##SUF(u, C * R * P, offw, K1, g, sh * P, img, off, K, wb, Op, \
                             O, oy0, OH, OW, sh * Wq, usebias ? bias : NULL, s, out, \
                             so_c, so_h, so_w);                                      \
        for (ptrdiff_t o = 0; o < O; o++)                                            \
            for (ptrdiff_t oy = oy0; oy < OH; oy++)                                  \
                for (ptrdiff_t ox = 0; ox < OW; ox++) {                              \
                    T got = out[o * so_c + oy * so_h + ox * so_w];                   \
                    T want = 0; /* the direct sum, in T, in the kernels' order */    \
                    for (ptrdiff_t t = 0; t < K; t++)                                \
                        want += w[t * Op + o] * img[off[t] + oy * sh * Wq + ox];     \
                    want += usebias ? bias[o] : 0;                                   \
                    int same = isfinite(want)                                        \
                        ? fabs(got - want) <= TOL * (1 + fabs(want))                 \
                        : (isnan(want) ? isnan(got) : got == want);                  \
                    if (!same) {                                                     \
                        if (bad < 5) printf(#SUF " C %td O %td kh %td d %td s %td"   \
                            " OW %td special %td: o=%td oy=%td ox=%td %g != %g\n",   \
                            C, O, kh, dh, sh, OW, special, o, oy, ox,                \
                            (double)got, (double)want);                              \
                        bad++;                                                       \
                    }                                                                \
                }                                                                    \
        for (ptrdiff_t i = 0; i < O * so_c; i++) {                                   \
            ptrdiff_t o = i / so_c, r = i % so_c, oy = r / so_h, ox = r % so_h;      \
            int inside = oy >= oy0 && oy < OH && ox % so_w == 0 && ox / so_w < OW;   \
            if (!inside && !isnan(out[i])) {                                         \
                if (bad < 5) printf(#SUF " O %td OW %td: gap %td (o %td) written\n", \
                                    O, OW, i, o);                                    \
                bad++;                                                               \
            }                                                                        \
        }                                                                            \
        w[rand() % (K1 * 3) * Op] = INFINITY;                                        \
        if (!cypool_wg_weights_##SUF(w, K1, Op, g)) {                                \
            printf(#SUF " weights with inf reported as finite\n");                   \
            bad++;                                                                   \
        }                                                                            \
        free(img); free(w); free(wb); free(g); free(u); free(bias); free(out);       \
        free(s); free(off); free(offw);                                              \
    }                                                                                \
    printf(#SUF ": %s (%d bad)\n", bad ? "WRONG" : "ok", bad);                       \
    return bad;                                                                      \
}
CHECK(float, f32, 1e-4, FLT_MAX / 1.5f)
CHECK(double, f64, 1e-10, DBL_MAX / 1.5)

int main(void) {
    srand(13);
    return (check_f32() + check_f64()) ? 1 : 0;
}
