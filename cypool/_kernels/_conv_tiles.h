/* Register-blocked micro-kernels of the vector-pixel convolution
 * (cypool/_kernels/_vconv.pxi does everything else: geometry, tap lists, threads).
 *
 * The convolution is, for every output pixel, a small matrix product
 *     out[o, e] = sum over taps t of w[t, o] * x_t[e]
 * where a tap t is an input pixel vector (channel c, row, column) of E
 * contiguous components. cypool_vc_tile computes one OB x EB block of it
 * with the accumulators in registers: each x_t load feeds OB fused
 * multiply-adds, each weight broadcast EB of them. cypool_vc_dots computes
 * the weight gradient's dot products over E, OB x TB of them at a time.
 *
 * GCC vector types hold the accumulators in registers: SSE2 in the
 * baseline build, AVX2 + FMA in the x86-64-v3 build (EB doubles), AVX-512
 * in the x86-64-v4 build (EB doubles again; its 32 registers take an 8 x 3
 * vector tile, and half-width tiles finish a small E).
 */
#ifndef CYPOOL_CONV_TILES_H
#define CYPOOL_CONV_TILES_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define CYPOOL_VC_VBYTES 64
/* 16-float vectors leave a small E (or its end) to scalar code: an 8-float
 * (4-double) tile and dot-product step take it instead. */
#define CYPOOL_VC_HALF_TAIL 1
#elif defined(__AVX2__)
#define CYPOOL_VC_VBYTES 32
#else
#define CYPOOL_VC_VBYTES 16
#endif
#ifndef CYPOOL_VC_HALF_TAIL
#define CYPOOL_VC_HALF_TAIL 0
#endif
/* E block: three vectors (the full tile); two- and one-vector tiles and a
 * scalar edge tile finish E. */
#define CYPOOL_VC_EB_F32 (3 * CYPOOL_VC_VBYTES / 4)
#define CYPOOL_VC_EB_F64 (3 * CYPOOL_VC_VBYTES / 8)
#define CYPOOL_VC_OB 4
#define CYPOOL_VC_TB 2

#if defined(__GNUC__)
/* The register tiles, with GCC/clang vector types, all made by one macro:
 * ROWS output channels x COLS vectors of E, every accumulator a vector
 * register, one broadcast weight per channel and tap. The full tile is
 * 4 x 3 (12 fused multiply-adds per tap for 3 loads and 4 broadcasts,
 * where the 4 x 2 tile issues 8 for 2 and 4), 8 x 3
 * where the AVX-512 build has 32 registers; 4 x 2, 4 x 1 and 4 x (half a
 * vector) finish E. Plain C loops left gcc 12 spilling the accumulators to
 * the stack, hence the unrolling by the preprocessor:
 *   CYPOOL_VC_Cn(M, i) is M(i, 0) ... M(i, n - 1), one row's columns;
 *   CYPOOL_VC_Rn(C, M) is C(M, 0) ... C(M, n - 1), every row. */
#define CYPOOL_VC_C1(M, i) M(i, 0)
#define CYPOOL_VC_C2(M, i) M(i, 0) M(i, 1)
#define CYPOOL_VC_C3(M, i) M(i, 0) M(i, 1) M(i, 2)
#define CYPOOL_VC_R1(C, M) C(M, 0)
#define CYPOOL_VC_R2(C, M) C(M, 0) C(M, 1)
#define CYPOOL_VC_R3(C, M) C(M, 0) C(M, 1) C(M, 2)
#define CYPOOL_VC_R4(C, M) C(M, 0) C(M, 1) C(M, 2) C(M, 3)
#define CYPOOL_VC_R8(C, M) CYPOOL_VC_R4(C, M) C(M, 4) C(M, 5) C(M, 6) C(M, 7)
#define CYPOOL_VC_ZERO(i, j) V a##i##j = {0};
#define CYPOOL_VC_LOAD(i, j) V x##j = *(const V *)(xp + j * L);
#define CYPOOL_VC_FMA(i, j) a##i##j += wp[i * ws] * x##j;
#define CYPOOL_VC_BIAS(i, j) a##i##j[0] += bias[i];
#define CYPOOL_VC_STORE(i, j) *(V *)(outs[i] + e0 + j * L) = a##i##j;
/* Tap t's weights for output channels i = 0, 1, ... are WROW[i * WS]. The
 * convolutions' weights are (taps, channels): WROW = w + t * ldw, WS = 1.
 * The dense layers' tile (cypool_vc_rows) takes the taps as a list of
 * rows (EXTRA declares it) of weights (channels, taps):
 * WROW = w + rowi[t], WS = ldw. */
#define CYPOOL_VC_TILE_GEN(NAME, T, VT, ROWS, COLS, EXTRA, WROW, WS)                 \
static inline void NAME(ptrdiff_t ntaps, const T *const *xs, ptrdiff_t xoff,        \
        const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs, const T *bias EXTRA) \
{                                                                                    \
    typedef VT V;                                                                    \
    const int L = (int)(sizeof(V) / sizeof(T));                                      \
    const ptrdiff_t ws = WS;                                                         \
    ROWS(COLS, CYPOOL_VC_ZERO)                                                       \
    for (ptrdiff_t t = 0; t < ntaps; t++) {                                          \
        const T *xp = xs[t] + xoff;                                                  \
        const T *wp = WROW;                                                          \
        COLS(CYPOOL_VC_LOAD, 0)                                                      \
        ROWS(COLS, CYPOOL_VC_FMA)                                                    \
    }                                                                                \
    if (bias) { ROWS(CYPOOL_VC_C1, CYPOOL_VC_BIAS) }                                 \
    ROWS(COLS, CYPOOL_VC_STORE)                                                      \
}
#define CYPOOL_VC_COMMA ,
#define CYPOOL_VC_TILE(NAME, T, VT, ROWS, COLS)                                      \
    CYPOOL_VC_TILE_GEN(NAME, T, VT, ROWS, COLS, , w + t * ldw, 1)
#define CYPOOL_VC_TILE_IX(NAME, T, VT, ROWS, COLS)                                   \
    CYPOOL_VC_TILE_GEN(NAME, T, VT, ROWS, COLS, CYPOOL_VC_COMMA const ptrdiff_t *rowi, \
                       w + rowi[t], ldw)

/* Tiles of R (1 to 3) output channels by 3, 2 and 1 vectors and half a
 * vector of E. */
#define CYPOOL_VC_ROWS(T, SUF, R, RM)                                                \
CYPOOL_VC_TILE(cypool_vc_tile_r##R##c3_##SUF, T, cypool_vc_v_##SUF, RM, CYPOOL_VC_C3)  \
CYPOOL_VC_TILE(cypool_vc_tile_r##R##c2_##SUF, T, cypool_vc_v_##SUF, RM, CYPOOL_VC_C2)  \
CYPOOL_VC_TILE(cypool_vc_tile_r##R##c1_##SUF, T, cypool_vc_v_##SUF, RM, CYPOOL_VC_C1)  \
CYPOOL_VC_TILE(cypool_vc_tile_r##R##h_##SUF, T, cypool_vc_h_##SUF, RM, CYPOOL_VC_C1)

#define CYPOOL_VC_ROWS_CASE(NAME)                                                    \
    NAME(ntaps, xs, xoff, w, ldw, e0, outs, bias); return 1;
#define CYPOOL_VC_ROWS_CASES(SUF, R)                                                 \
    case R * 4 + 3: CYPOOL_VC_ROWS_CASE(cypool_vc_tile_r##R##c3_##SUF)                \
    case R * 4 + 2: CYPOOL_VC_ROWS_CASE(cypool_vc_tile_r##R##c2_##SUF)                \
    case R * 4 + 1: CYPOOL_VC_ROWS_CASE(cypool_vc_tile_r##R##c1_##SUF)                \
    case R * 4 + 0: CYPOOL_VC_ROWS_CASE(cypool_vc_tile_r##R##h_##SUF)

/* A tile of 4 output channels by one component of E, for the end of E. */
#define CYPOOL_VC_TILE1(NAME, T)                                                     \
static inline void NAME(ptrdiff_t ntaps, const T *const *xs, ptrdiff_t xoff,        \
        const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs, const T *bias)      \
{                                                                                    \
    T a0 = 0, a1 = 0, a2 = 0, a3 = 0;                                                \
    for (ptrdiff_t t = 0; t < ntaps; t++) {                                          \
        const T *wp = w + t * ldw;                                                   \
        T x = xs[t][xoff];                                                           \
        a0 += wp[0] * x; a1 += wp[1] * x; a2 += wp[2] * x; a3 += wp[3] * x;          \
    }                                                                                \
    if (bias) { a0 += bias[0]; a1 += bias[1]; a2 += bias[2]; a3 += bias[3]; }        \
    outs[0][e0] = a0; outs[1][e0] = a1; outs[2][e0] = a2; outs[3][e0] = a3;          \
}

#define CYPOOL_VC_FULL(T, SUF, EB)                                                   \
typedef T cypool_vc_v_##SUF __attribute__((vector_size(CYPOOL_VC_VBYTES), aligned(sizeof(T)))); \
typedef T cypool_vc_h_##SUF __attribute__((vector_size(CYPOOL_VC_VBYTES / 2), aligned(sizeof(T)))); \
typedef T cypool_vc_q_##SUF __attribute__((vector_size(4 * sizeof(T)), aligned(sizeof(T)))); \
typedef T cypool_vc_d_##SUF __attribute__((vector_size(2 * sizeof(T)), aligned(sizeof(T)))); \
enum { CYPOOL_VC_VL_##SUF = CYPOOL_VC_VBYTES / sizeof(T) };                           \
CYPOOL_VC_TILE(cypool_vc_tile_full_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C3) \
CYPOOL_VC_TILE(cypool_vc_tile_full8_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R8, CYPOOL_VC_C3) \
/* The full tile over a list of the weight rows (cypool_vc_rows), and its    \
 * 8 x 3 form for the AVX-512 build. */                                       \
CYPOOL_VC_TILE_IX(cypool_vc_tile_ix_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C3) \
CYPOOL_VC_TILE_IX(cypool_vc_tile_ix8_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R8, CYPOOL_VC_C3) \
CYPOOL_VC_TILE(cypool_vc_tile_two_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C2) \
CYPOOL_VC_TILE(cypool_vc_tile_one_##SUF, T, cypool_vc_v_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C1) \
/* Half a vector (8 floats or 4 doubles): the end of E, and all of a small  \
 * E, in the AVX-512 build. */                                                \
CYPOOL_VC_TILE(cypool_vc_tile_half_##SUF, T, cypool_vc_h_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C1) \
/* The last 1 to 3 output channels (O not a multiple of 4: a convolution    \
 * with one or two output channels is all edge), by the same E blocks. */   \
CYPOOL_VC_ROWS(T, SUF, 1, CYPOOL_VC_R1) CYPOOL_VC_ROWS(T, SUF, 2, CYPOOL_VC_R2)       \
CYPOOL_VC_ROWS(T, SUF, 3, CYPOOL_VC_R3)                                              \
static inline int cypool_vc_tile_rows_##SUF(int no, ptrdiff_t ntaps,                  \
        const T *const *xs, ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0,  \
        ptrdiff_t ne, ptrdiff_t EB_, T *const *outs, const T *bias)                   \
{                                                                                    \
    int c = ne == EB_ ? 3 : ne == 2 * EB_ / 3 ? 2 : ne == EB_ / 3 ? 1                 \
          : (CYPOOL_VC_HALF_TAIL && ne == EB_ / 6) ? 0 : -1;                          \
    switch (c < 0 ? -1 : no * 4 + c) {                                               \
    CYPOOL_VC_ROWS_CASES(SUF, 1) CYPOOL_VC_ROWS_CASES(SUF, 2) CYPOOL_VC_ROWS_CASES(SUF, 3) \
    }                                                                                \
    return 0;                                                                        \
}                                                                                    \
/* The end of E shorter than every tile above (ne < one vector): tiles of   \
 * 4, 2 and 1 components, the accumulators in registers. The edge tile below \
 * takes a variable count, keeps them in memory, and cost several times a    \
 * full vector's for 1 to 7 components. Returns 0 for a longer block. */      \
CYPOOL_VC_TILE(cypool_vc_tile_q4_##SUF, T, cypool_vc_q_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C1) \
CYPOOL_VC_TILE(cypool_vc_tile_q2_##SUF, T, cypool_vc_d_##SUF, CYPOOL_VC_R4, CYPOOL_VC_C1) \
CYPOOL_VC_TILE1(cypool_vc_tile_q1_##SUF, T)                                          \
static inline int cypool_vc_tile_part_##SUF(ptrdiff_t ntaps, const T *const *xs,     \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, ptrdiff_t ne,       \
        T *const *outs, const T *bias)                                               \
{                                                                                    \
    if (ne >= CYPOOL_VC_VL_##SUF || ne >= 8)                                         \
        return 0;                                                                    \
    ptrdiff_t e = 0;                                                                 \
    if (ne - e >= 4) {                                                               \
        cypool_vc_tile_q4_##SUF(ntaps, xs, xoff + e, w, ldw, e0 + e, outs, bias);    \
        e += 4;                                                                      \
        bias = NULL;                                                                 \
    }                                                                                \
    if (ne - e >= 2) {                                                               \
        cypool_vc_tile_q2_##SUF(ntaps, xs, xoff + e, w, ldw, e0 + e, outs, bias);    \
        e += 2;                                                                      \
        bias = NULL;                                                                 \
    }                                                                                \
    if (ne - e >= 1)                                                                 \
        cypool_vc_tile_q1_##SUF(ntaps, xs, xoff + e, w, ldw, e0 + e, outs, bias);    \
    return 1;                                                                        \
}                                                                                    \
                                                                                     \
/* gw[o * ldgw + tap[t]] += dot(gs[o][:E], xs[t][:E]), full OB x TB block. */       \
static inline void cypool_vc_dots_full_##SUF(const T *const *gs, const T *const *xs, \
        const ptrdiff_t *tap, ptrdiff_t E, T *gw, ptrdiff_t ldgw)                    \
{                                                                                    \
    typedef cypool_vc_v_##SUF V;                                                     \
    const int L = CYPOOL_VC_VL_##SUF;                                                \
    V a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0}; \
    const T *g0 = gs[0], *g1 = gs[1], *g2 = gs[2], *g3 = gs[3], *x0 = xs[0], *x1 = xs[1]; \
    ptrdiff_t e = 0;                                                                 \
    for (; e + L <= E; e += L) {                                                     \
        V u = *(const V *)(x0 + e), v = *(const V *)(x1 + e), g;                     \
        g = *(const V *)(g0 + e); a00 += g * u; a01 += g * v;                        \
        g = *(const V *)(g1 + e); a10 += g * u; a11 += g * v;                        \
        g = *(const V *)(g2 + e); a20 += g * u; a21 += g * v;                        \
        g = *(const V *)(g3 + e); a30 += g * u; a31 += g * v;                        \
    }                                                                                \
    typedef cypool_vc_h_##SUF H;                                                     \
    H h[4][2] = {{{0}}};                                                             \
    if (CYPOOL_VC_HALF_TAIL && e + L / 2 <= E) {                                     \
        H u = *(const H *)(x0 + e), v = *(const H *)(x1 + e);                        \
        for (int o = 0; o < 4; o++) {                                                \
            H g = *(const H *)(gs[o] + e);                                           \
            h[o][0] = g * u; h[o][1] = g * v;                                        \
        }                                                                            \
        e += L / 2;                                                                  \
    }                                                                                \
    V acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};                  \
    for (int o = 0; o < 4; o++)                                                      \
        for (int t = 0; t < 2; t++) {                                                \
            T s = 0;                                                                 \
            if (CYPOOL_VC_HALF_TAIL) {                                               \
                /* Halve the wide accumulator first: fewer scalar adds. */      \
                H lohi[2];                                                           \
                memcpy(lohi, &acc[o][t], sizeof(V));                                 \
                H r = lohi[0] + lohi[1] + h[o][t];                                   \
                for (int l = 0; l < L / 2; l++) s += r[l];                           \
            } else {                                                                 \
                for (int l = 0; l < L; l++) s += acc[o][t][l];                       \
            }                                                                        \
            for (ptrdiff_t k = e; k < E; k++) s += gs[o][k] * xs[t][k];              \
            gw[o * ldgw + tap[t]] += s;                                              \
        }                                                                            \
}
#else
/* Other compilers (MSVC): the same tiles as plain loops. */
#define CYPOOL_VC_FULL(T, SUF, EB)                                                   \
static inline void cypool_vc_tile_full_##SUF(ptrdiff_t ntaps, const T *const *xs,    \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias)                                                               \
{                                                                                    \
    cypool_vc_tile_edge_##SUF(ntaps, xs, xoff, w, ldw, e0, EB, CYPOOL_VC_OB, outs, bias); \
}                                                                                    \
static inline void cypool_vc_tile_ix_##SUF(ptrdiff_t ntaps, const T *const *xs,     \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias, const ptrdiff_t *rowi)                                        \
{                                                                                    \
    T acc[CYPOOL_VC_OB][EB] = {{0}};                                                 \
    for (ptrdiff_t t = 0; t < ntaps; t++)                                            \
        for (int o = 0; o < CYPOOL_VC_OB; o++)                                       \
            for (ptrdiff_t e = 0; e < EB; e++)                                       \
                acc[o][e] += w[o * ldw + rowi[t]] * xs[t][xoff + e];                 \
    for (int o = 0; o < CYPOOL_VC_OB; o++) {                                         \
        if (bias) acc[o][0] += bias[o];                                              \
        for (ptrdiff_t e = 0; e < EB; e++)                                           \
            outs[o][e0 + e] = acc[o][e];                                             \
    }                                                                                \
}                                                                                    \
static inline void cypool_vc_tile_ix8_##SUF(ptrdiff_t ntaps, const T *const *xs,    \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias, const ptrdiff_t *rowi)                                        \
{                                                                                    \
    cypool_vc_tile_ix_##SUF(ntaps, xs, xoff, w, ldw, e0, outs, bias, rowi);          \
    cypool_vc_tile_ix_##SUF(ntaps, xs, xoff, w + 4 * ldw, ldw, e0, outs + 4,         \
                            bias ? bias + 4 : NULL, rowi);                           \
}                                                                                    \
static inline void cypool_vc_tile_full8_##SUF(ptrdiff_t ntaps, const T *const *xs,   \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias)                                                               \
{                                                                                    \
    cypool_vc_tile_full_##SUF(ntaps, xs, xoff, w, ldw, e0, outs, bias);              \
    cypool_vc_tile_full_##SUF(ntaps, xs, xoff, w + 4, ldw, e0, outs + 4, bias ? bias + 4 : NULL); \
}                                                                                    \
static inline void cypool_vc_tile_two_##SUF(ptrdiff_t ntaps, const T *const *xs,     \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias)                                                               \
{                                                                                    \
    cypool_vc_tile_edge_##SUF(ntaps, xs, xoff, w, ldw, e0, 2 * EB / 3, CYPOOL_VC_OB, outs, bias); \
}                                                                                    \
static inline void cypool_vc_tile_one_##SUF(ptrdiff_t ntaps, const T *const *xs,    \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias)                                                               \
{                                                                                    \
    cypool_vc_tile_edge_##SUF(ntaps, xs, xoff, w, ldw, e0, EB / 3, CYPOOL_VC_OB, outs, bias); \
}                                                                                    \
static inline void cypool_vc_tile_half_##SUF(ptrdiff_t ntaps, const T *const *xs,   \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, T *const *outs,      \
        const T *bias)                                                               \
{                                                                                    \
    cypool_vc_tile_edge_##SUF(ntaps, xs, xoff, w, ldw, e0, EB / 6, CYPOOL_VC_OB, outs, bias); \
}                                                                                    \
static inline void cypool_vc_dots_full_##SUF(const T *const *gs, const T *const *xs, \
        const ptrdiff_t *tap, ptrdiff_t E, T *gw, ptrdiff_t ldgw)                    \
{                                                                                    \
    cypool_vc_dots_edge_##SUF(CYPOOL_VC_OB, gs, CYPOOL_VC_TB, xs, tap, E, gw, ldgw); \
}                                                                                    \
static inline int cypool_vc_tile_part_##SUF(ptrdiff_t ntaps, const T *const *xs,     \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, ptrdiff_t ne,       \
        T *const *outs, const T *bias)                                               \
{                                                                                    \
    return 0; /* the edge tile takes it */                                           \
}                                                                                    \
static inline int cypool_vc_tile_rows_##SUF(int no, ptrdiff_t ntaps,                  \
        const T *const *xs, ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0,  \
        ptrdiff_t ne, ptrdiff_t EB_, T *const *outs, const T *bias)                   \
{                                                                                    \
    return 0; /* the edge tile takes it */                                           \
}
#endif

/* Whether v[0:n] holds a value other than +0 or -0 (NaN counts): the first
 * value decides most rows; the rest ORs the bit patterns and drops the
 * sign bit, an integer reduction that vectorises (comparing the doubles
 * to 0 cost a lane shuffle per vector). */
#define CYPOOL_VC_NONZERO(T, U, SUF)                                                   \
static inline int cypool_vc_nonzero_##SUF(const T *v, ptrdiff_t n)                  \
{                                                                                    \
    U r = 0;                                                                         \
    if (n > 0 && v[0] != 0)                                                          \
        return 1;                                                                    \
    for (ptrdiff_t i = 0; i < n; i++) {                                              \
        U b;                                                                         \
        memcpy(&b, v + i, sizeof b);                                                 \
        r |= b;                                                                      \
    }                                                                                \
    return (U)(r << 1) != 0;                                                         \
}
CYPOOL_VC_NONZERO(float, uint32_t, f32)
CYPOOL_VC_NONZERO(double, uint64_t, f64)

#define CYPOOL_VC_DEFINE(T, SUF, EB)                                                  \
/* Any block up to no x ne (edges of O and E). */                                    \
static inline void cypool_vc_tile_edge_##SUF(ptrdiff_t ntaps, const T *const *xs,    \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, ptrdiff_t ne, int no, \
        T *const *outs, const T *bias)                                               \
{                                                                                    \
    T acc[CYPOOL_VC_OB][EB];                                                         \
    for (int o = 0; o < no; o++)                                                     \
        for (ptrdiff_t e = 0; e < ne; e++)                                           \
            acc[o][e] = 0;                                                           \
    for (ptrdiff_t t = 0; t < ntaps; t++) {                                          \
        const T *xp = xs[t] + xoff;                                                  \
        const T *wp = w + t * ldw;                                                   \
        for (int o = 0; o < no; o++) {                                               \
            T wv = wp[o];                                                            \
            for (ptrdiff_t e = 0; e < ne; e++)                                       \
                acc[o][e] += wv * xp[e];                                             \
        }                                                                            \
    }                                                                                \
    if (bias) for (int o = 0; o < no; o++) acc[o][0] += bias[o];                     \
    for (int o = 0; o < no; o++)                                                     \
        for (ptrdiff_t e = 0; e < ne; e++)                                           \
            outs[o][e0 + e] = acc[o][e];                                             \
}                                                                                    \
                                                                                     \
/* gw[o * ldgw + tap[t]] += dot(gs[o][:E], xs[t][:E]) for o < no, t < nt       \
 * (no <= OB, nt <= TB): the edges of the blocking. */                              \
static inline void cypool_vc_dots_edge_##SUF(int no, const T *const *gs, int nt,     \
        const T *const *xs, const ptrdiff_t *tap, ptrdiff_t E, T *gw, ptrdiff_t ldgw) \
{                                                                                    \
    for (int o = 0; o < no; o++)                                                     \
        for (int t = 0; t < nt; t++) {                                               \
            T s = 0;                                                                 \
            for (ptrdiff_t e = 0; e < E; e++) s += gs[o][e] * xs[t][e];              \
            gw[o * ldgw + tap[t]] += s;                                              \
        }                                                                            \
}                                                                                    \
CYPOOL_VC_FULL(T, SUF, EB)                                                           \
                                                                                     \
/* Every output channel's tiles over one block of E: outs[o][e0:e0 + ne] from  \
 * the taps' vectors xs[t] + xoff. */                                         \
static inline void cypool_vc_oblocks_##SUF(ptrdiff_t ntaps, const T *const *xs,      \
        ptrdiff_t xoff, const T *w, ptrdiff_t ldw, ptrdiff_t e0, ptrdiff_t ne,       \
        ptrdiff_t O, T *const *outs, const T *bias)                                  \
{                                                                                    \
    ptrdiff_t o0 = 0;                                                                \
    if (CYPOOL_VC_HALF_TAIL && ne == EB)                                             \
        for (; o0 + 2 * CYPOOL_VC_OB <= O; o0 += 2 * CYPOOL_VC_OB)                   \
            cypool_vc_tile_full8_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, outs + o0,  \
                                       (bias && e0 == 0) ? bias + o0 : NULL);        \
    for (; o0 < O; o0 += CYPOOL_VC_OB) {                                             \
        int no = O - o0 < CYPOOL_VC_OB ? (int)(O - o0) : CYPOOL_VC_OB;               \
        const T *b = (bias && e0 == 0) ? bias + o0 : NULL;                           \
        if (no == CYPOOL_VC_OB && ne == EB)                                          \
            cypool_vc_tile_full_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, outs + o0, b); \
        else if (no == CYPOOL_VC_OB && ne == 2 * EB / 3)                             \
            cypool_vc_tile_two_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, outs + o0, b); \
        else if (no == CYPOOL_VC_OB && ne == EB / 3)                                 \
            cypool_vc_tile_one_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, outs + o0, b); \
        else if (CYPOOL_VC_HALF_TAIL && no == CYPOOL_VC_OB && ne == EB / 6)          \
            cypool_vc_tile_half_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, outs + o0, b); \
        else if (!(no == CYPOOL_VC_OB                                                \
                   ? cypool_vc_tile_part_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, ne,  \
                                               outs + o0, b)                         \
                   : cypool_vc_tile_rows_##SUF(no, ntaps, xs, xoff, w + o0, ldw, e0,  \
                                               ne, EB, outs + o0, b)))               \
            cypool_vc_tile_edge_##SUF(ntaps, xs, xoff, w + o0, ldw, e0, ne, no,      \
                                      outs + o0, b);                                 \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* One block of E, [e0, e0 + ne), for every output channel. */                    \
static inline void cypool_vc_eblock_##SUF(ptrdiff_t ntaps, const T *const *xs,       \
        const T *w, ptrdiff_t ldw, ptrdiff_t e0, ptrdiff_t ne, ptrdiff_t O,          \
        T *const *outs, const T *bias, T *pack, const T *const *pp)                   \
{                                                                                    \
    ptrdiff_t xoff = e0;                                                             \
    if (pack && O > CYPOOL_VC_OB) {                                                  \
        /* Copy this block of every tap into contiguous rows: tap vectors E      \
         * apart in memory alias in L1 when E is a power of two. */              \
        for (ptrdiff_t t = 0; t < ntaps; t++)                                        \
            memcpy(pack + t * EB, xs[t] + e0, ne * sizeof(T));                       \
        xs = pp;                                                                     \
        xoff = 0;                                                                    \
    }                                                                                \
    cypool_vc_oblocks_##SUF(ntaps, xs, xoff, w, ldw, e0, ne, O, outs, bias);         \
}                                                                                    \
                                                                                     \
/* A standard convolution's real outputs only. Its image, seen as one pixel  \
 * whose vector is the output grid (_conv.pxi), has rows of OW positions Wq   \
 * apart: real position r of the grid is at (r / OW) * Wq + r % OW of each    \
 * tap's vector. outs[o][0:nr] = the sum over taps of w[t*ldw + o] times the  \
 * taps' values at positions r_lo to r_lo + nr, for every o < O. Each       \
 * block of EB positions is gathered from its rows into pack, then zeros up   \
 * to whole vectors (their outputs, up to nr rounded up to a vector, are      \
 * written and not meant to be read): the Wq - OW columns between rows, which \
 * cypool_vc_pixel would compute and the caller drop, are skipped. */        \
static inline void cypool_vc_grid_##SUF(ptrdiff_t ntaps, const T *const *xs,         \
        const T *w, ptrdiff_t ldw, ptrdiff_t r_lo, ptrdiff_t nr, ptrdiff_t OW,       \
        ptrdiff_t Wq, ptrdiff_t O, T *const *outs, T *pack, const T *const *pp)       \
{                                                                                    \
    /* VL: a vector of the tiles; CP: the copies' unit, 32 bytes. */              \
    enum { VL = EB / 3, CP = 32 / sizeof(T) };                                       \
    ptrdiff_t off[EB], len[EB];                                                      \
    for (ptrdiff_t k0 = 0; k0 < nr; k0 += EB) {                                      \
        ptrdiff_t ne = nr - k0 < EB ? nr - k0 : EB, nv = (ne + VL - 1) / VL * VL;     \
        if (CYPOOL_VC_HALF_TAIL && ne <= EB / 6)                                     \
            nv = EB / 6;  /* the half-vector tile */                             \
        ptrdiff_t ns = 0, r = r_lo + k0, end = r + ne;                               \
        while (r < end) {  /* the block's pieces of rows */                      \
            ptrdiff_t row = r / OW, col = r - row * OW;                              \
            len[ns] = OW - col < end - r ? OW - col : end - r;                       \
            off[ns] = row * Wq + col;                                                \
            r += len[ns++];                                                          \
        }                                                                            \
        for (ptrdiff_t t = 0; t < ntaps; t++) {                                      \
            T *dst = pack + t * EB;                                                  \
            for (ptrdiff_t s = 0; s < ns; s++) {                                     \
                const T *src = xs[t] + off[s];                                       \
                ptrdiff_t n = len[s], i = 0;                                         \
                /* Whole units, the last one overlapping the one before. */      \
                for (; i + CP <= n; i += CP)                                         \
                    memcpy(dst + i, src + i, CP * sizeof(T));                        \
                if (i < n && n >= CP)                                                \
                    memcpy(dst + n - CP, src + n - CP, CP * sizeof(T));              \
                else                                                                 \
                    for (; i < n; i++) dst[i] = src[i];                              \
                dst += n;                                                            \
            }                                                                        \
            for (ptrdiff_t i = ne; i < nv; i++) pack[t * EB + i] = 0;                \
        }                                                                            \
        cypool_vc_oblocks_##SUF(ntaps, pp, 0, w, ldw, k0, nv, O, outs, NULL);        \
    }                                                                                \
}                                                                                    \
                                                                                     \
/* outs[o][e_lo:E] = (bias[o] at component 0) + sum_t w[t*ldw + o] * xs[t][e_lo:E] \
 * for every o < O; bias may be NULL. E blocks outside, O blocks inside, so a   \
 * block of the taps' vectors stays in L1 while every output channel uses it.   \
 * pack (ntaps * EB values) and pp (pp[t] = pack + t * EB) are per-thread        \
 * buffers for that block, or NULL. */                                          \
static inline void cypool_vc_pixel_##SUF(ptrdiff_t ntaps, const T *const *xs,        \
        const T *w, ptrdiff_t ldw, ptrdiff_t e_lo, ptrdiff_t E, ptrdiff_t O,         \
        T *const *outs, const T *bias, T *pack, const T *const *pp)                   \
{                                                                                    \
    ptrdiff_t e0 = e_lo;                                                             \
    for (; e0 + EB <= E; e0 += EB)                                                   \
        cypool_vc_eblock_##SUF(ntaps, xs, w, ldw, e0, EB, O, outs, bias, pack, pp);  \
    if (e0 + 2 * EB / 3 <= E) {                                                      \
        cypool_vc_eblock_##SUF(ntaps, xs, w, ldw, e0, 2 * EB / 3, O, outs, bias, pack, pp); \
        e0 += 2 * EB / 3;                                                            \
    }                                                                                \
    if (e0 + EB / 3 <= E) {                                                          \
        cypool_vc_eblock_##SUF(ntaps, xs, w, ldw, e0, EB / 3, O, outs, bias, pack, pp); \
        e0 += EB / 3;                                                                \
    }                                                                                \
    if (CYPOOL_VC_HALF_TAIL && e0 + EB / 6 <= E) {                                   \
        cypool_vc_eblock_##SUF(ntaps, xs, w, ldw, e0, EB / 6, O, outs, bias, pack, pp); \
        e0 += EB / 6;                                                                \
    }                                                                                \
    if (e0 < E)                                                                      \
        cypool_vc_eblock_##SUF(ntaps, xs, w, ldw, e0, E - e0, O, outs, bias, pack, pp); \
}                                                                                    \
                                                                                     \
/* outs[o][e0:e0 + EB] for o < O (a multiple of OB) from the n taps listed:  \
 * xs[t] + xoff is tap t's block of E, and w (O, D), rows ldw apart, holds  \
 * its weights in column rowi[t]. The dense layers of certification list a  \
 * block's taps that are not all zero (_zonotope.pxi): the others add       \
 * nothing. */                                                              \
static inline void cypool_vc_rows_##SUF(ptrdiff_t n, const T *const *xs,             \
        ptrdiff_t xoff, const ptrdiff_t *rowi, const T *w, ptrdiff_t ldw,            \
        ptrdiff_t e0, ptrdiff_t O, T *const *outs, const T *bias)                    \
{                                                                                    \
    ptrdiff_t o0 = 0;                                                                \
    if (CYPOOL_VC_HALF_TAIL)                                                         \
        for (; o0 + 2 * CYPOOL_VC_OB <= O; o0 += 2 * CYPOOL_VC_OB)                   \
            cypool_vc_tile_ix8_##SUF(n, xs, xoff, w + o0 * ldw, ldw, e0, outs + o0,  \
                                     bias ? bias + o0 : NULL, rowi);                 \
    for (; o0 + CYPOOL_VC_OB <= O; o0 += CYPOOL_VC_OB)                               \
        cypool_vc_tile_ix_##SUF(n, xs, xoff, w + o0 * ldw, ldw, e0, outs + o0,       \
                                bias ? bias + o0 : NULL, rowi);                      \
}                                                                                    \
                                                                                     \
/* Dot-product blocks of the weight gradient: full ones vectorised. */         \
static inline void cypool_vc_dots_##SUF(int no, const T *const *gs, int nt,          \
        const T *const *xs, const ptrdiff_t *tap, ptrdiff_t E, T *gw, ptrdiff_t ldgw) \
{                                                                                    \
    if (no == CYPOOL_VC_OB && nt == CYPOOL_VC_TB)                                    \
        cypool_vc_dots_full_##SUF(gs, xs, tap, E, gw, ldgw);                         \
    else                                                                             \
        cypool_vc_dots_edge_##SUF(no, gs, nt, xs, tap, E, gw, ldgw);                 \
}
CYPOOL_VC_DEFINE(float, f32, CYPOOL_VC_EB_F32)
CYPOOL_VC_DEFINE(double, f64, CYPOOL_VC_EB_F64)
#endif
