/* Direct stride-1 convolution of small images, vectorised along output rows
 * (cypool/_kernels/_conv_direct.pxi makes the buffers; cypool/conv.py chooses it).
 *
 * A batch-1 call of a small network (a 28 x 28 image, a 5 x 5 kernel, a
 * few channels) is a few microseconds of arithmetic: the phase buffers,
 * tap lists and chunks of _conv.pxi cost as much again. Here one
 * zero-padded copy P of the image is all the set-up:
 *
 *   out[o][y][x] = bias[o] + sum over taps t = (c, i, j) of
 *                  w[t][o] * P[c][y + i*dh][x + j*dw]
 *
 * (the input gradient is the same sum over the padded output gradient with
 * the kernel flipped and transposed), and the weight gradient is
 *
 *   gw[o][t] += sum over (y, x) of G[o][y][x] * P[c][y + i*dh][x + j*dw]
 *
 * with G the output gradient, its rows zero-padded to whole vectors.
 * P's rows are long enough that every vector read stays inside it.
 *
 * Forward tiles hold ROWS output channels x COLS vectors of an output row
 * in registers (each input vector feeds ROWS fused multiply-adds, each
 * weight broadcast COLS); weight-gradient tiles hold ROWS channels x TAPS
 * consecutive taps of a kernel row (each G vector feeds TAPS of them).
 * Both are made by one macro each, for 1-4 rows and 1-3 columns or taps.
 */
#ifndef CYPOOL_CONV_DIRECT_H
#define CYPOOL_CONV_DIRECT_H
#include <stddef.h>
#include <string.h>
#include "_conv_tiles.h" /* CYPOOL_VC_VBYTES and the row/column enumerators */

#if defined(__GNUC__)
#define CYPOOL_CD_VLEN_F32 (CYPOOL_VC_VBYTES / 4)
#define CYPOOL_CD_VLEN_F64 (CYPOOL_VC_VBYTES / 8)

/* Forward tiles: R channels x Y output rows x K vectors of a row. With one
 * or two output channels (an input gradient of a one-channel image, a tiny
 * network's first layer) a tile of one row would hold only 3 or 6
 * accumulators, too few to hide the latency of a fused multiply-add; such
 * tiles take 4 or 2 rows at once. The enumerators, for the preprocessor:
 *   CYPOOL_CD_Kn(M, r, y) is M(r, y, 0) ... M(r, y, n - 1), a row's vectors;
 *   CYPOOL_CD_RrYy(K, M) is K(M, r, y) for every channel r and row y;
 *   CYPOOL_CD_Yy(K, M) is K(M, 0, y) for every row y (the loads). */
#define CYPOOL_CD_K1(M, r, y) M(r, y, 0)
#define CYPOOL_CD_K2(M, r, y) M(r, y, 0) M(r, y, 1)
#define CYPOOL_CD_K3(M, r, y) M(r, y, 0) M(r, y, 1) M(r, y, 2)
#define CYPOOL_CD_Y1(K, M) K(M, 0, 0)
#define CYPOOL_CD_Y2(K, M) K(M, 0, 0) K(M, 0, 1)
#define CYPOOL_CD_Y4(K, M) K(M, 0, 0) K(M, 0, 1) K(M, 0, 2) K(M, 0, 3)
#define CYPOOL_CD_R1Y1(K, M) K(M, 0, 0)
#define CYPOOL_CD_R1Y4(K, M) K(M, 0, 0) K(M, 0, 1) K(M, 0, 2) K(M, 0, 3)
#define CYPOOL_CD_R2Y1(K, M) K(M, 0, 0) K(M, 1, 0)
#define CYPOOL_CD_R2Y2(K, M) K(M, 0, 0) K(M, 0, 1) K(M, 1, 0) K(M, 1, 1)
#define CYPOOL_CD_R3Y1(K, M) K(M, 0, 0) K(M, 1, 0) K(M, 2, 0)
#define CYPOOL_CD_R4Y1(K, M) K(M, 0, 0) K(M, 1, 0) K(M, 2, 0) K(M, 3, 0)
#define CYPOOL_CD_NK_CYPOOL_CD_K1 1
#define CYPOOL_CD_NK_CYPOOL_CD_K2 2
#define CYPOOL_CD_NK_CYPOOL_CD_K3 3

/* x stays in a register (the empty asm): gcc cannot read it from memory
 * again in place of the register. Not in the AVX-512 layout compiled
 * without AVX-512 (tests/c), where no register holds a 64-byte vector.
 * The constraint names the vector registers: "v" on x86, "w" on aarch64;
 * elsewhere nothing is pinned. */
#if CYPOOL_VC_VBYTES == 64 && !defined(__AVX512VL__)
#define CYPOOL_CD_PIN(x)
#elif defined(__x86_64__) || defined(__i386__)
#define CYPOOL_CD_PIN(x) __asm__("" : "+v"(x));
#elif defined(__aarch64__)
#define CYPOOL_CD_PIN(x) __asm__("" : "+w"(x));
#else
#define CYPOOL_CD_PIN(x)
#endif

/* A tap's multiply-adds, in the order that keeps a tile's values in the 16
 * vector registers of AVX2: with 3 or 4 channels, each of the row's K
 * vectors loaded once and each channel's weight broadcast in turn; with 1
 * or 2 (and up to 12 accumulators) the weights broadcast first and each
 * input vector used as it is loaded. (w - 0 broadcasts w: w + 0 would not
 * be folded away, as -0 + 0 is +0; and the empty asm keeps gcc from
 * reading an input vector from memory once for each channel.) */
#define CYPOOL_CD_TAP_R3(RY, YS, K) YS(K, CYPOOL_CD_LOAD) RY(K, CYPOOL_CD_FMA)
#define CYPOOL_CD_TAP_R4(RY, YS, K) YS(K, CYPOOL_CD_LOAD) RY(K, CYPOOL_CD_FMA)
#define CYPOOL_CD_TAP_R1(RY, YS, K) V w0 = wp[0] - (V){0}; YS(K, CYPOOL_CD_LF1)
#define CYPOOL_CD_TAP_R2(RY, YS, K)                                                  \
    V w0 = wp[0] - (V){0}, w1 = wp[1] - (V){0}; YS(K, CYPOOL_CD_LF2)
#define CYPOOL_CD_LF1(r, y, k) { V x = *(const V *)(q + y * ldp + k * L); a0##y##k += w0 * x; }
#define CYPOOL_CD_LF2(r, y, k) { V x = *(const V *)(q + y * ldp + k * L);            \
                                 CYPOOL_CD_PIN(x) /* one load, in a register */      \
                                 a0##y##k += w0 * x; a1##y##k += w1 * x; }

#define CYPOOL_CD_ZERO(r, y, k) V a##r##y##k = {0};
#define CYPOOL_CD_LOAD(r, y, k) V x##y##k = *(const V *)(q + y * ldp + k * L);
#define CYPOOL_CD_FMA(r, y, k) a##r##y##k += wp[r] * x##y##k;
#define CYPOOL_CD_BIAS(r, y, k) a##r##y##k += bias[r];
#define CYPOOL_CD_STORE(r, y, k) *(V *)(dst + r * so + y * so_y + k * L) = a##r##y##k;
#define CYPOOL_CD_SPILL(r, y, k) *(V *)(spill + ((r * 4 + y) * 3 + k) * L) = a##r##y##k;
#define CYPOOL_CD_COPY(r, y, k)                                                      \
    memcpy(dst + r * so + y * so_y, spill + (r * 4 + y) * 3 * L, n * sizeof(*dst));

/* The output tile at dst (channels so apart, rows so_y apart; n <= K*L
 * outputs a row) = bias + the taps of C channels (plane apart) x kh rows
 * (sdh apart) x kw columns (dw apart) from p (rows ldp apart), the weights
 * of tap t at w[t * ldw]. */
#define CYPOOL_CD_FTILE(NAME, T, VT, RY, YS, K, TAP)                                 \
static inline void NAME(const T *p, ptrdiff_t plane, ptrdiff_t ldp, ptrdiff_t sdh,   \
        int C, int kh, int kw, int dw, const T *w, ptrdiff_t ldw, T *dst,            \
        ptrdiff_t so, ptrdiff_t so_y, int n, const T *bias)                          \
{                                                                                    \
    typedef VT V;                                                                    \
    const int L = (int)(sizeof(V) / sizeof(T));                                      \
    const T *wp = w;                                                                 \
    RY(K, CYPOOL_CD_ZERO)                                                            \
    for (int c = 0; c < C; c++)                                                      \
        for (int i = 0; i < kh; i++) {                                               \
            const T *row = p + c * plane + i * sdh;                                  \
            for (int j = 0; j < kw; j++, wp += ldw) {                                \
                const T *q = row + j * dw;                                           \
                TAP(RY, YS, K)                                                       \
            }                                                                        \
        }                                                                            \
    if (bias) { RY(K, CYPOOL_CD_BIAS) }                                              \
    if (n == CYPOOL_CD_NK_##K * L) {                                                 \
        RY(K, CYPOOL_CD_STORE)                                                       \
    } else {                                                                         \
        T spill[4 * 4 * 3 * (CYPOOL_VC_VBYTES / sizeof(T))];                         \
        RY(K, CYPOOL_CD_SPILL)                                                       \
        RY(CYPOOL_CD_K1, CYPOOL_CD_COPY)                                             \
    }                                                                                \
}

/* Weight-gradient tiles: R channels x T taps, any T taps (their offsets in
 * P given), so that a group runs across the rows of the kernel: T = 6, 4,
 * 3, 3 for R = 1 to 4 keeps 6 to 12 sums in flight, enough to hide the
 * latency of their multiply-adds, and their inputs in registers (each
 * loaded once: the empty asm, as in the forward's). */
#define CYPOOL_CD_C4(M, i) M(i, 0) M(i, 1) M(i, 2) M(i, 3)
#define CYPOOL_CD_C5(M, i) CYPOOL_CD_C4(M, i) M(i, 4)
#define CYPOOL_CD_C6(M, i) CYPOOL_CD_C5(M, i) M(i, 5)
#define CYPOOL_CD_WZERO(r, k) V a##r##k = {0};
#define CYPOOL_CD_WLOAD(r, k) V x##k = *(const V *)(q + off[k]); CYPOOL_CD_PIN(x##k)
#define CYPOOL_CD_WMASK(r, k) x##k = (V)((M)x##k & mask);
#define CYPOOL_CD_GLOAD(r, k) V g##r = *(const V *)(gq + r * gplane);
#define CYPOOL_CD_WFMA(r, k) a##r##k += g##r * x##k;
#define CYPOOL_CD_WSUM(r, k) { S s = 0; for (int l = 0; l < L; l++) s += a##r##k[l]; \
                               gw[r * ldgw + k] += s; }

/* gw[r * ldgw + k] += the sum over OH rows (ldp apart in P, ldg in G) and
 * nv vectors of G[r] (gplane apart) times P at tap k (off[k] from P).
 * The last vector's lanes past the output are zero in G, and are cleared
 * in P's vectors by mask (0 * inf would be NaN). */
#define CYPOOL_CD_WTILE(NAME, T, VT, MT, ROWS, TAPS)                                 \
static inline void NAME(const T *P, const ptrdiff_t *off, ptrdiff_t ldp,             \
        const T *g, ptrdiff_t gplane, ptrdiff_t ldg, int OH, int nv, MT mask, T *gw, \
        ptrdiff_t ldgw)                                                              \
{                                                                                    \
    typedef VT V;                                                                    \
    typedef MT M;                                                                    \
    typedef T S;                                                                     \
    const int L = (int)(sizeof(V) / sizeof(T));                                      \
    ROWS(TAPS, CYPOOL_CD_WZERO)                                                      \
    for (int y = 0; y < OH; y++)                                                     \
        for (int v = 0; v < nv; v++) {                                               \
            const T *q = P + y * ldp + v * L;                                        \
            const T *gq = g + y * ldg + v * L;                                       \
            TAPS(CYPOOL_CD_WLOAD, 0)                                                 \
            if (v == nv - 1) { TAPS(CYPOOL_CD_WMASK, 0) }                            \
            ROWS(CYPOOL_VC_C1, CYPOOL_CD_GLOAD)                                      \
            ROWS(TAPS, CYPOOL_CD_WFMA)                                               \
        }                                                                            \
    ROWS(TAPS, CYPOOL_CD_WSUM)                                                       \
}

#define CYPOOL_CD_FTILES(T, SUF, VT, RR, YY)                                         \
CYPOOL_CD_FTILE(cypool_cd_f##RR##YY##1_##SUF, T, VT, CYPOOL_CD_R##RR##Y##YY, CYPOOL_CD_Y##YY, \
                CYPOOL_CD_K1, CYPOOL_CD_TAP_R##RR)                                   \
CYPOOL_CD_FTILE(cypool_cd_f##RR##YY##2_##SUF, T, VT, CYPOOL_CD_R##RR##Y##YY, CYPOOL_CD_Y##YY, \
                CYPOOL_CD_K2, CYPOOL_CD_TAP_R##RR)                                   \
CYPOOL_CD_FTILE(cypool_cd_f##RR##YY##3_##SUF, T, VT, CYPOOL_CD_R##RR##Y##YY, CYPOOL_CD_Y##YY, \
                CYPOOL_CD_K3, CYPOOL_CD_TAP_R##RR)
#define CYPOOL_CD_WTILE_R(T, SUF, VT, MT, R, RM, K, TAPS)                            \
CYPOOL_CD_WTILE(cypool_cd_w##R##K##_##SUF, T, VT, MT, RM, TAPS)
#define CYPOOL_CD_WTILES(T, SUF, VT, MT)                                             \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 1, CYPOOL_VC_C1)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 2, CYPOOL_VC_C2)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 3, CYPOOL_VC_C3)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 4, CYPOOL_CD_C4)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 5, CYPOOL_CD_C5)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 1, CYPOOL_VC_R1, 6, CYPOOL_CD_C6)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 2, CYPOOL_VC_R2, 1, CYPOOL_VC_C1)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 2, CYPOOL_VC_R2, 2, CYPOOL_VC_C2)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 2, CYPOOL_VC_R2, 3, CYPOOL_VC_C3)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 2, CYPOOL_VC_R2, 4, CYPOOL_CD_C4)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 3, CYPOOL_VC_R3, 1, CYPOOL_VC_C1)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 3, CYPOOL_VC_R3, 2, CYPOOL_VC_C2)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 3, CYPOOL_VC_R3, 3, CYPOOL_VC_C3)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 4, CYPOOL_VC_R4, 1, CYPOOL_VC_C1)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 4, CYPOOL_VC_R4, 2, CYPOOL_VC_C2)                  \
CYPOOL_CD_WTILE_R(T, SUF, VT, MT, 4, CYPOOL_VC_R4, 3, CYPOOL_VC_C3)

#define CYPOOL_CD_FCASE(R, Y, K, SUF)                                                \
    case R * 100 + Y * 10 + K: cypool_cd_f##R##Y##K##_##SUF(p, plane, ldp, sdh, C,   \
        kh, kw, dw, w + o0, O, dst, so_o, so_y, n, bias ? bias + o0 : NULL); break;
#define CYPOOL_CD_FCASES(SUF, R, Y)                                                  \
    CYPOOL_CD_FCASE(R, Y, 1, SUF) CYPOOL_CD_FCASE(R, Y, 2, SUF) CYPOOL_CD_FCASE(R, Y, 3, SUF)
#define CYPOOL_CD_WCASE(R, K, SUF)                                                   \
    case R * 10 + K: cypool_cd_w##R##K##_##SUF(P, off, ldp, G + o0 * gplane, gplane, \
                        ldg, OH, nv, mask, gw + o0 * ldgw + t0, ldgw); break;
#define CYPOOL_CD_WCASES(SUF)                                                        \
    CYPOOL_CD_WCASE(1, 1, SUF) CYPOOL_CD_WCASE(1, 2, SUF) CYPOOL_CD_WCASE(1, 3, SUF) \
    CYPOOL_CD_WCASE(1, 4, SUF) CYPOOL_CD_WCASE(1, 5, SUF) CYPOOL_CD_WCASE(1, 6, SUF) \
    CYPOOL_CD_WCASE(2, 1, SUF) CYPOOL_CD_WCASE(2, 2, SUF) CYPOOL_CD_WCASE(2, 3, SUF) \
    CYPOOL_CD_WCASE(2, 4, SUF) CYPOOL_CD_WCASE(3, 1, SUF) CYPOOL_CD_WCASE(3, 2, SUF) \
    CYPOOL_CD_WCASE(3, 3, SUF) CYPOOL_CD_WCASE(4, 1, SUF) CYPOOL_CD_WCASE(4, 2, SUF) \
    CYPOOL_CD_WCASE(4, 3, SUF)

#define CYPOOL_CD_DEFINE(T, SUF, IT)                                                 \
typedef IT cypool_cd_m_##SUF __attribute__((vector_size(CYPOOL_VC_VBYTES)));         \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 1, 4)                                    \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 1, 1)                                    \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 2, 2)                                    \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 2, 1)                                    \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 3, 1)                                    \
CYPOOL_CD_FTILES(T, SUF, cypool_vc_v_##SUF, 4, 1)                                    \
CYPOOL_CD_WTILES(T, SUF, cypool_vc_v_##SUF, cypool_cd_m_##SUF)                       \
                                                                                     \
/* out[o * so_o + y * so_y + x] for O channels of OH x OW outputs, from the          \
 * padded image P (C planes of `plane` values, rows ldp apart), the taps'            \
 * weights w[t * O + o] with t = (c * kh + i) * kw + j; bias may be NULL. */         \
static inline void cypool_cd_forward_##SUF(const T *P, ptrdiff_t plane, ptrdiff_t ldp, \
        int C, int kh, int kw, int dh, int dw, const T *w, int O, int OH, int OW,    \
        T *out, ptrdiff_t so_o, ptrdiff_t so_y, const T *bias)                       \
{                                                                                    \
    const int L = CYPOOL_VC_VBYTES / (int)sizeof(T);                                 \
    const ptrdiff_t sdh = dh * ldp;                                                  \
    for (int o0 = 0; o0 < O; o0 += 4) {                                              \
        int R = O - o0 < 4 ? O - o0 : 4;                                             \
        int Y = R == 1 ? 4 : R == 2 ? 2 : 1;                                         \
        for (int y = 0; y < OH; y += Y) {                                            \
            if (y + Y > OH)                                                          \
                Y = 1;                                                               \
            for (int x0 = 0; x0 < OW; x0 += 3 * L) {                                 \
                int n = OW - x0 < 3 * L ? OW - x0 : 3 * L;                           \
                /* A last part of a vector: its tile ends at OW instead,             \
                 * recomputing outputs of the one before (no partial store). */      \
                int K = (n + L - 1) / L;                                             \
                if (n < K * L && OW >= K * L) {                                      \
                    x0 = OW - K * L;                                                 \
                    n = K * L;                                                       \
                }                                                                    \
                const T *p = P + y * ldp + x0;                                       \
                T *dst = out + o0 * so_o + y * so_y + x0;                            \
                switch (R * 100 + Y * 10 + K) {                                      \
                    CYPOOL_CD_FCASES(SUF, 1, 4) CYPOOL_CD_FCASES(SUF, 1, 1)          \
                    CYPOOL_CD_FCASES(SUF, 2, 2) CYPOOL_CD_FCASES(SUF, 2, 1)          \
                    CYPOOL_CD_FCASES(SUF, 3, 1) CYPOOL_CD_FCASES(SUF, 4, 1)          \
                }                                                                    \
            }                                                                        \
        }                                                                            \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* gw[o * ldgw + t] += the weight gradient of one image: G holds O planes            \
 * (gplane apart) of OH rows (ldg apart) of OW values, zero from OW to a whole       \
 * vector; P as for the forward, C channels. */                                      \
static inline void cypool_cd_weight_grad_##SUF(const T *P, ptrdiff_t plane,          \
        ptrdiff_t ldp, int C, int kh, int kw, int dh, int dw, const T *G,            \
        ptrdiff_t gplane, ptrdiff_t ldg, int O, int OH, int OW, T *gw, ptrdiff_t ldgw) \
{                                                                                    \
    const int L = CYPOOL_VC_VBYTES / (int)sizeof(T);                                 \
    const int nv = (OW + L - 1) / L;                                                 \
    cypool_cd_m_##SUF mask;                                                          \
    for (int l = 0; l < L; l++)                                                      \
        mask[l] = (nv - 1) * L + l < OW ? (IT)-1 : 0;                                \
    const int K = C * kh * kw;                                                       \
    ptrdiff_t off[6];                                                                \
    for (int o0 = 0; o0 < O; o0 += 4) {                                              \
        int R = O - o0 < 4 ? O - o0 : 4;                                             \
        int TB = R == 1 ? 6 : R == 2 ? 4 : 3;                                        \
        for (int t0 = 0; t0 < K; t0 += TB) {                                         \
            int nt = K - t0 < TB ? K - t0 : TB;                                      \
            for (int k = 0; k < nt; k++) { /* tap t0 + k = (c, i, j) */              \
                int t = t0 + k, j = t % kw, i = t / kw % kh, c = t / (kw * kh);      \
                off[k] = c * plane + i * dh * ldp + j * dw;                          \
            }                                                                        \
            switch (R * 10 + nt) { CYPOOL_CD_WCASES(SUF) }                           \
        }                                                                            \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* The sum of n values from G, n a multiple of the vector length. */                 \
static inline T cypool_cd_sum_##SUF(const T *G, ptrdiff_t n)                         \
{                                                                                    \
    typedef cypool_vc_v_##SUF V;                                                     \
    const int L = (int)(sizeof(V) / sizeof(T));                                      \
    V s0 = {0}, s1 = {0};                                                            \
    ptrdiff_t i = 0;                                                                 \
    for (; i + 2 * L <= n; i += 2 * L) {                                             \
        s0 += *(const V *)(G + i);                                                   \
        s1 += *(const V *)(G + i + L);                                               \
    }                                                                                \
    if (i < n)                                                                       \
        s0 += *(const V *)(G + i);                                                   \
    s0 += s1;                                                                        \
    T s = 0;                                                                         \
    for (int l = 0; l < L; l++)                                                      \
        s += s0[l];                                                                  \
    return s;                                                                        \
}

CYPOOL_CD_DEFINE(float, f32, int)
CYPOOL_CD_DEFINE(double, f64, long long)

#else /* plain C for other compilers: the same sums, one value at a time */
#define CYPOOL_CD_VLEN_F32 1
#define CYPOOL_CD_VLEN_F64 1
#define CYPOOL_CD_DEFINE(T, SUF)                                                     \
static inline void cypool_cd_forward_##SUF(const T *P, ptrdiff_t plane, ptrdiff_t ldp, \
        int C, int kh, int kw, int dh, int dw, const T *w, int O, int OH, int OW,    \
        T *out, ptrdiff_t so_o, ptrdiff_t so_y, const T *bias)                       \
{                                                                                    \
    for (int o = 0; o < O; o++)                                                      \
        for (int y = 0; y < OH; y++)                                                 \
            for (int x = 0; x < OW; x++) {                                           \
                T a = bias ? bias[o] : 0;                                            \
                const T *wp = w + o;                                                 \
                for (int c = 0; c < C; c++)                                          \
                    for (int i = 0; i < kh; i++)                                     \
                        for (int j = 0; j < kw; j++, wp += O)                        \
                            a += *wp * P[c * plane + (y + i * dh) * ldp + x + j * dw]; \
                out[o * so_o + y * so_y + x] = a;                                    \
            }                                                                        \
}                                                                                    \
static inline void cypool_cd_weight_grad_##SUF(const T *P, ptrdiff_t plane,          \
        ptrdiff_t ldp, int C, int kh, int kw, int dh, int dw, const T *G,            \
        ptrdiff_t gplane, ptrdiff_t ldg, int O, int OH, int OW, T *gw, ptrdiff_t ldgw) \
{                                                                                    \
    for (int o = 0; o < O; o++)                                                      \
        for (int c = 0; c < C; c++)                                                  \
            for (int i = 0; i < kh; i++)                                             \
                for (int j = 0; j < kw; j++) {                                       \
                    T a = 0;                                                         \
                    for (int y = 0; y < OH; y++)                                     \
                        for (int x = 0; x < OW; x++)                                 \
                            a += G[o * gplane + y * ldg + x]                         \
                                 * P[c * plane + (y + i * dh) * ldp + x + j * dw];   \
                    gw[o * ldgw + (c * kh + i) * kw + j] += a;                       \
                }                                                                    \
}                                                                                    \
static inline T cypool_cd_sum_##SUF(const T *G, ptrdiff_t n)                         \
{                                                                                    \
    T s = 0;                                                                         \
    for (ptrdiff_t i = 0; i < n; i++)                                                \
        s += G[i];                                                                   \
    return s;                                                                        \
}
CYPOOL_CD_DEFINE(float, f32)
CYPOOL_CD_DEFINE(double, f64)
#endif
#endif
