/* The forward of a convolution three taps wide at column stride and
 * dilation 1, with output channels in the vector lanes (_conv_ovec.h's
 * tiles), by F(2, 3) minimal filtering along the rows (Winograd; Lavin
 * and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
 *
 * Two outputs y0, y1 of a row, from the four inputs d0 .. d3 under them
 * and the taps g0, g1, g2 of one (channel, kernel row), are
 *
 *     y0 = m0 + m1 + m2,   y1 = m1 - m2 - m3,   with
 *     m0 = (d0 - d2) g0,   m1 = (d1 + d2) (g0 + g1 + g2) / 2,
 *     m2 = (d2 - d1) (g0 - g1 + g2) / 2,   m3 = (d1 - d3) g2:
 *
 * four multiply-adds where the direct sum takes six. The four m's are
 * linear, so each is summed over the (channel, kernel row) pairs first:
 * M_k = sum of U_k[pair] G_k[pair], four convolutions one tap wide of
 * the transformed input rows U_k (the d's sums, a value a pair of
 * outputs) with the transformed weights G_k (cypool_wg_weights), each the
 * lanes' tiles over K / 3 taps. Then y0 = (M0 + M1) + M2 and y1 = (M1 -
 * M2) - M3, plus the bias.
 *
 * Rounding: the transforms add a rounding or two to each term; the
 * outputs match the direct sums to float rounding (tests/test_conv.py).
 * IEEE specials: an output row whose sums (before the bias) are not all
 * finite is computed again the direct way, so inf and NaN inputs, and
 * sums that overflow only in the transformed terms, give the direct
 * sums' results. */
#ifndef CYPOOL_CONV_WINOGRAD_H
#define CYPOOL_CONV_WINOGRAD_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "_conv_ovec.h"

/* Values of one output row's transformed sums: 4 x Op rows of lds. */
#define CYPOOL_WG_SCRATCH(Op, OW) (4 * (Op) * CYPOOL_OV_LDS(((OW) + 1) / 2))

#define CYPOOL_WG_DEFINE(T, SUF, UT, EXP, EXP1)                                      \
/* g = the transformed weights G_0 .. G_3 of the tap-major wt (K = 3 K1     \
 * taps (c, i, j), rows of Op), G_k at g + k * K1 * Op in                    \
 * cypool_ov_block's layout (K1 taps (c, i)). 1 where one is not finite. */  \
static int cypool_wg_weights_##SUF(const T *wt, ptrdiff_t K1, ptrdiff_t Op, T *g)   \
{                                                                                    \
    const ptrdiff_t L = CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T);                     \
    int bad = 0;                                                                     \
    for (ptrdiff_t ob = 0; ob < Op;) {                                               \
        const ptrdiff_t n = (Op - ob >= 2 * L ? 2 : 1) * L;                          \
        for (ptrdiff_t t = 0; t < K1; t++)                                           \
            for (ptrdiff_t o = 0; o < n; o++) {                                      \
                const T g0 = wt[(3 * t) * Op + ob + o];                              \
                const T g1 = wt[(3 * t + 1) * Op + ob + o];                          \
                const T g2 = wt[(3 * t + 2) * Op + ob + o];                          \
                const T h1 = (g0 + g1 + g2) / 2, h2 = (g0 - g1 + g2) / 2;            \
                T *d = g + ob * K1 + t * n + o;                                      \
                d[0] = g0;                                                           \
                d[K1 * Op] = h1;                                                     \
                d[2 * K1 * Op] = h2;                                                 \
                d[3 * K1 * Op] = g2;                                                 \
                /* x - x is 0 but for inf and NaN */                                 \
                bad |= !(h1 - h1 == 0) | !(h2 - h2 == 0) | !(g0 - g0 == 0)           \
                       | !(g2 - g2 == 0);                                            \
            }                                                                        \
        ob += n;                                                                     \
    }                                                                                \
    return bad;                                                                      \
}                                                                                    \
                                                                                     \
/* u = the transformed rows of the padded rows xb (C planes of R rows of     \
 * Wq, Wq >= 2P + 1): U_k at u + k * C * R * P, plane c, row r, pair m:      \
 * d0 - d2, d1 + d2, d2 - d1, d1 - d3 of xb's row r at columns 2m .. 2m + 3  \
 * (U_3 is 0 where column 2m + 3 is past the row). */                         \
static void cypool_wg_input_##SUF(const T *xb, ptrdiff_t C, ptrdiff_t R,            \
        ptrdiff_t Wq, ptrdiff_t P, T *u)                                             \
{                                                                                    \
    const ptrdiff_t ks = C * R * P;                                                  \
    /* whole pairs whose d3 lies in the row */                                       \
    const ptrdiff_t P4 = (Wq - 2) / 2 < P ? (Wq - 2) / 2 : P;                        \
    for (ptrdiff_t cr = 0; cr < C * R; cr++) {                                       \
        const T *__restrict x = xb + cr * Wq;                                        \
        T *__restrict v0 = u + cr * P, *__restrict v1 = v0 + ks;                     \
        T *__restrict v2 = v1 + ks, *__restrict v3 = v2 + ks;                        \
        for (ptrdiff_t m = 0; m < P4; m++) {                                         \
            const T d0 = x[2 * m], d1 = x[2 * m + 1], d2 = x[2 * m + 2];             \
            const T d3 = x[2 * m + 3];                                               \
            v0[m] = d0 - d2; v1[m] = d1 + d2; v2[m] = d2 - d1; v3[m] = d1 - d3;      \
        }                                                                            \
        for (ptrdiff_t m = P4; m < P; m++) {                                         \
            const T d0 = x[2 * m], d1 = x[2 * m + 1], d2 = x[2 * m + 2];             \
            /* d3 lies past the row; m3 goes only to y1, which is past it too */     \
            v0[m] = d0 - d2; v1[m] = d1 + d2; v2[m] = d2 - d1; v3[m] = 0;            \
        }                                                                            \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* Row oy's outputs from the sums M_k (rows of lds, planes ms apart, in s):  \
 * y0 = (M0 + M1) + M2 and y1 = (M1 - M2) - M3 plus the bias, to out. 1      \
 * where a sum (before the bias) is not finite: its exponent bits all ones,  \
 * which, plus one in the lowest of them, carry into the sign bit (integer  \
 * operations, which vectorize; a float flag's sum or compare did not). */  \
static int cypool_wg_out_##SUF(const T *s, ptrdiff_t lds, ptrdiff_t ms, ptrdiff_t O, \
        ptrdiff_t OW, const T *bias, T *out, ptrdiff_t so_c, ptrdiff_t so_w)         \
{                                                                                    \
    const ptrdiff_t P2 = OW / 2;  /* whole pairs */                                  \
    UT flag = 0;                                                                     \
    for (ptrdiff_t o = 0; o < O; o++) {                                              \
        const T b = bias ? bias[o] : (T)0;                                           \
        const T *__restrict m0 = s + o * lds, *__restrict m1 = m0 + ms;              \
        const T *__restrict m2 = m1 + ms, *__restrict m3 = m2 + ms;                  \
        T *__restrict d = out + o * so_c;                                            \
        UT f = 0;                                                                    \
        for (ptrdiff_t p = 0; p < P2; p++) {                                         \
            const T y0 = (m0[p] + m1[p]) + m2[p], y1 = (m1[p] - m2[p]) - m3[p];      \
            UT u0, u1;                                                               \
            memcpy(&u0, &y0, sizeof u0);                                             \
            memcpy(&u1, &y1, sizeof u1);                                             \
            f |= ((u0 & EXP) + EXP1) | ((u1 & EXP) + EXP1);                          \
            if (so_w == 1) {                                                         \
                d[2 * p] = y0 + b;                                                   \
                d[2 * p + 1] = y1 + b;                                               \
            } else {                                                                 \
                d[(2 * p) * so_w] = y0 + b;                                          \
                d[(2 * p + 1) * so_w] = y1 + b;                                      \
            }                                                                        \
        }                                                                            \
        if (OW % 2) {                                                                \
            const T y0 = (m0[P2] + m1[P2]) + m2[P2];                                 \
            UT u0;                                                                   \
            memcpy(&u0, &y0, sizeof u0);                                             \
            f |= (u0 & EXP) + EXP1;                                                  \
            d[(2 * P2) * so_w] = y0 + b;                                             \
        }                                                                            \
        flag |= f;                                                                   \
    }                                                                                \
    return (flag & ~(~(UT)0 >> 1)) != 0;                                             \
}                                                                                    \
                                                                                     \
/* Output rows oy0 .. oy1 - 1 of one image, as cypool_ov_rows computes them \
 * (its arguments, img the padded rows), by F(2, 3): u the transformed rows \
 * (cypool_wg_input, rows rstep_u apart a row of outputs), offw[t] the      \
 * offset of tap (c, i) in each U_k, g the transformed weights, s a scratch \
 * of CYPOOL_WG_SCRATCH(Op, OW) values (at least cypool_ov_rows's). A row   \
 * whose sums are not all finite runs cypool_ov_rows. */                    \
static void cypool_wg_rows_##SUF(const T *u, ptrdiff_t ks, const ptrdiff_t *offw,   \
        ptrdiff_t K1, const T *g, ptrdiff_t rstep_u, const T *img,                   \
        const ptrdiff_t *off, ptrdiff_t K, const T *w, ptrdiff_t Op, ptrdiff_t O,    \
        ptrdiff_t oy0, ptrdiff_t oy1, ptrdiff_t OW, ptrdiff_t rstep, const T *bias,  \
        T *s, T *out, ptrdiff_t so_c, ptrdiff_t so_h, ptrdiff_t so_w)                \
{                                                                                    \
    const ptrdiff_t P = (OW + 1) / 2, lds = CYPOOL_OV_LDS(P), ms = Op * lds;         \
    for (ptrdiff_t oy = oy0; oy < oy1; oy++) {                                       \
        for (ptrdiff_t k = 0; k < 4; k++) {                                          \
            cypool_ov_row_##SUF(P, 1, K1, u + k * ks + oy * rstep_u, offw,           \
                                g + k * K1 * Op, Op, s + k * ms, lds);               \
        }                                                                            \
        if (cypool_wg_out_##SUF(s, lds, ms, O, OW, bias, out + oy * so_h, so_c,      \
                                so_w))                                               \
            cypool_ov_rows_##SUF(img, off, K, w, Op, O, oy, oy + 1, OW, rstep, 1,    \
                                 bias, s, out, so_c, so_h, so_w, NULL, 0, 0, 0);     \
    }                                                                                \
}

CYPOOL_WG_DEFINE(float, f32, uint32_t, 0x7f800000u, 0x00800000u)
CYPOOL_WG_DEFINE(double, f64, uint64_t, 0x7ff0000000000000ull, 0x0010000000000000ull)

#endif /* CYPOOL_CONV_WINOGRAD_H */
