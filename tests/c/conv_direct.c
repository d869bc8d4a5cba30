/* The direct stride-1 kernels of cypool/_kernels/_conv_direct.h against plain loops:
 * the forward (bias or none, outputs written through channel and row
 * strides, every tile of 1-4 channels x 1, 2 or 4 rows x 1-3 vectors and
 * a row's last part of a vector), the weight gradient (1-9 channels, tap
 * groups of 1-6, an inf in the lanes a row's last vector reads past the
 * row's end, which the mask must keep out) and the vector sum. Built by
 * tests/test_kernel_headers.py once per vector width, the AVX-512 layout
 * included. Exits 1 on a wrong value. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "_conv_direct.h"

#define CHECK(T, SUF, VL, TOL)                                                       \
static int check_##SUF(void) {                                                       \
    int bad = 0;                                                                     \
    for (int trial = 0; trial < 600; trial++) {                                      \
        int C = 1 + rand() % 3, O = 1 + rand() % 9, kh = 1 + rand() % 4;             \
        int kw = 1 + rand() % 4, dh = 1 + rand() % 2, dw = 1 + rand() % 2;           \
        int OH = 1 + rand() % 9, OW = 1 + rand() % 40, usebias = rand() % 2;         \
        int L = VL, nv = (OW + L - 1) / L;                                           \
        ptrdiff_t ldp = nv * L + (kw - 1) * dw + rand() % 3;                         \
        ptrdiff_t Hb = OH + (kh - 1) * dh, plane = Hb * ldp;                         \
        ptrdiff_t so_y = OW + rand() % 3, so_o = OH * so_y + rand() % 5;             \
        int K = C * kh * kw;                                                         \
        T *P = malloc(C * plane * sizeof(T)), *w = malloc(K * O * sizeof(T));        \
        T *bias = malloc(O * sizeof(T)), *out = malloc(O * so_o * sizeof(T));        \
        ptrdiff_t ldg = nv * L, gplane = OH * ldg;                                   \
        T *G = calloc(O * gplane, sizeof(T)), *gw = malloc(O * K * sizeof(T));       \
        for (ptrdiff_t i = 0; i < C * plane; i++) P[i] = (T)((rand() % 2001) - 1000) / 300; \
        for (int i = 0; i < K * O; i++) w[i] = (T)((rand() % 2001) - 1000) / 700;    \
        for (int o = 0; o < O; o++) bias[o] = (T)o + 0.5;                            \
        for (ptrdiff_t i = 0; i < O * so_o; i++) out[i] = -12345;                    \
        cypool_cd_forward_##SUF(P, plane, ldp, C, kh, kw, dh, dw, w, O, OH, OW, out, \
                                so_o, so_y, usebias ? bias : NULL);                  \
        for (int o = 0; o < O; o++)                                                  \
            for (ptrdiff_t r = 0; r < so_o; r++) {                                   \
                int y = (int)(r / so_y), x = (int)(r % so_y);                        \
                double want = -12345;                                                \
                if (y < OH && x < OW) {                                              \
                    want = usebias ? bias[o] : 0;                                    \
                    for (int c = 0; c < C; c++) for (int i = 0; i < kh; i++)         \
                        for (int j = 0; j < kw; j++)                                 \
                            want += (double)w[((c * kh + i) * kw + j) * O + o]       \
                                    * P[c * plane + (y + i * dh) * ldp + x + j * dw]; \
                }                                                                    \
                double got = out[o * so_o + r];                                      \
                if (fabs(got - want) > TOL * (1 + fabs(want))) {                     \
                    if (bad < 5) printf(#SUF " forward C=%d O=%d k=%dx%d d=%dx%d out=%dx%d" \
                        " o=%d y=%d x=%d: %g != %g\n", C, O, kh, kw, dh, dw, OH, OW, o, y, x, \
                        got, want);                                                  \
                    bad++;                                                           \
                }                                                                    \
            }                                                                        \
        /* The weight gradient: G zero past OW, P's columns past a row's             \
         * outputs an inf where only the last vector's extra lanes read it. */       \
        for (int o = 0; o < O; o++)                                                  \
            for (int y = 0; y < OH; y++)                                             \
                for (int x = 0; x < OW; x++)                                         \
                    G[o * gplane + y * ldg + x] = (T)((rand() % 2001) - 1000) / 500; \
        if (OW < nv * L)                                                             \
            P[(ptrdiff_t)(C - 1) * plane + OW] = INFINITY;                           \
        for (int i = 0; i < O * K; i++) gw[i] = 1;                                   \
        cypool_cd_weight_grad_##SUF(P, plane, ldp, C, kh, kw, dh, dw, G, gplane, ldg, \
                                    O, OH, OW, gw, K);                               \
        for (int o = 0; o < O; o++)                                                  \
            for (int c = 0; c < C; c++) for (int i = 0; i < kh; i++)                 \
                for (int j = 0; j < kw; j++) {                                       \
                    double want = 1;                                                 \
                    for (int y = 0; y < OH; y++) for (int x = 0; x < OW; x++)        \
                        want += (double)G[o * gplane + y * ldg + x]                  \
                                * P[c * plane + (y + i * dh) * ldp + x + j * dw];    \
                    double got = gw[o * K + (c * kh + i) * kw + j];                  \
                    int same = isnan(want) ? isnan(got) : isinf(want) ? got == want  \
                                           : fabs(got - want) <= TOL * (10 + fabs(want)); \
                    if (!same) {                                                     \
                        if (bad < 5) printf(#SUF " weight grad C=%d O=%d k=%dx%d d=%dx%d" \
                            " out=%dx%d o=%d tap=%d,%d,%d: %g != %g\n", C, O, kh, kw, dh, \
                            dw, OH, OW, o, c, i, j, got, want);                      \
                        bad++;                                                       \
                    }                                                                \
                }                                                                    \
        double want = 0;                                                             \
        for (ptrdiff_t i = 0; i < gplane; i++) want += G[i];                         \
        if (fabs(cypool_cd_sum_##SUF(G, gplane) - want) > TOL * (10 + fabs(want))) { \
            if (bad < 5) printf(#SUF " sum of %td values\n", gplane);                \
            bad++;                                                                   \
        }                                                                            \
        free(P); free(w); free(bias); free(out); free(G); free(gw);                  \
    }                                                                                \
    printf(#SUF ": %s (%d bad)\n", bad ? "WRONG" : "ok", bad);                       \
    return bad;                                                                      \
}
CHECK(float, f32, CYPOOL_CD_VLEN_F32, 1e-4)
CHECK(double, f64, CYPOOL_CD_VLEN_F64, 1e-10)

int main(void) {
    srand(7);
    return (check_f32() + check_f64()) ? 1 : 0;
}
