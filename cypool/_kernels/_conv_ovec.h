/* The standard convolution's forward with the output channels in the
 * vector lanes (cypool/_kernels/_conv.pxi chooses it, fills the padded
 * image and runs the rows).
 *
 * The phase-buffer tiles of _conv_tiles.h put output positions in the
 * lanes: a run of positions is then the "virtual" output, whose Wq - OW
 * columns past every row are computed and dropped, 40% more multiply-adds
 * than LeNet's 10 x 10 outputs of 14 x 14 images need. Here a vector
 * holds L output channels of one position instead:
 *
 *     acc[p] (channels ob .. ob + L - 1) += w[t, ob ..] * x_t[p]
 *
 * for every tap t = (c, i, j), with x_t[p] one input value broadcast (an
 * embedded broadcast of the multiply-add where AVX-512 has it). A tile is
 * X positions of one output row by one or two vectors of channels, every
 * sum a register; only real positions are computed, at any column stride
 * SW (1 or 2, a constant of the tile). Its weights are a block of their
 * own (cypool_ov_block), read in order. It stores its sums transposed
 * into a scratch row, one row of OW per channel, from which the row is
 * copied out plus the bias: stored straight into the output instead, the
 * channels' planes, 4 KiB apart in a [64, 32, 32, 32] output, fought over
 * the same L1 sets (1.7x the time). The caller fills the padded image a
 * band of rows at a time (cypool/_kernels/_conv.pxi), and the rows
 * prefetch the next band's source. It pays where the virtual output
 * drops many columns, on short rows, and where there are many taps
 * (docs/performance.md, "Output channels in the lanes", under "Standard convolution").
 *
 * Tiles hold X x OV sums: at most 14 x 1 or 14 x 2 with AVX-512's 32
 * registers, 12 x 1 or 6 x 2 with 16. */
#ifndef CYPOOL_CONV_OVEC_H
#define CYPOOL_CONV_OVEC_H
#include <stddef.h>
#include "_conv_tiles.h"

#if CYPOOL_VC_VBYTES == 64
#define CYPOOL_OV_XMAX1 14
#define CYPOOL_OV_XMAX2 14
#define CYPOOL_OV_WIDE2(T, SUF, SW, G) G(T, SUF, 13, 2, SW) G(T, SUF, 14, 2, SW)
#else
#define CYPOOL_OV_XMAX1 12
#define CYPOOL_OV_XMAX2 6
#define CYPOOL_OV_WIDE2(T, SUF, SW, G)
#endif

#if defined(__GNUC__)
/* CYPOOL_OV_Pn(M) is M(0) ... M(n - 1): a tile's positions, unrolled by
 * the preprocessor (gcc 12 spilled sums kept in arrays). */
#define CYPOOL_OV_P1(M) M(0)
#define CYPOOL_OV_P2(M) CYPOOL_OV_P1(M) M(1)
#define CYPOOL_OV_P3(M) CYPOOL_OV_P2(M) M(2)
#define CYPOOL_OV_P4(M) CYPOOL_OV_P3(M) M(3)
#define CYPOOL_OV_P5(M) CYPOOL_OV_P4(M) M(4)
#define CYPOOL_OV_P6(M) CYPOOL_OV_P5(M) M(5)
#define CYPOOL_OV_P7(M) CYPOOL_OV_P6(M) M(6)
#define CYPOOL_OV_P8(M) CYPOOL_OV_P7(M) M(7)
#define CYPOOL_OV_P9(M) CYPOOL_OV_P8(M) M(8)
#define CYPOOL_OV_P10(M) CYPOOL_OV_P9(M) M(9)
#define CYPOOL_OV_P11(M) CYPOOL_OV_P10(M) M(10)
#define CYPOOL_OV_P12(M) CYPOOL_OV_P11(M) M(11)
#define CYPOOL_OV_P13(M) CYPOOL_OV_P12(M) M(12)
#define CYPOOL_OV_P14(M) CYPOOL_OV_P13(M) M(13)

/* One or two vectors of channels (OV = 1, 2): sums a_k (and b_k), the
 * weights w0 (and w1) of a tap, their stores to the scratch row. */
#define CYPOOL_OV_ZERO1(k) V a##k = {0};
#define CYPOOL_OV_ZERO2(k) V a##k = {0}, b##k = {0};
#define CYPOOL_OV_W1 const V w0 = *(const V *)(w + t * ldw);
#define CYPOOL_OV_W2 CYPOOL_OV_W1 const V w1 = *(const V *)(w + t * ldw + L);
#define CYPOOL_OV_FMA1(k) { const S xv = xt[(k) * sw]; a##k += w0 * xv; }
#define CYPOOL_OV_FMA2(k) { const S xv = xt[(k) * sw]; a##k += w0 * xv; b##k += w1 * xv; }
/* Position k's sums, transposed: lane l to s[l * lds + k]. */
#define CYPOOL_OV_STORE1(k) for (ptrdiff_t l = 0; l < L; l++) s[l * lds + (k)] = a##k[l];
#define CYPOOL_OV_STORE2(k) CYPOOL_OV_STORE1(k)                                      \
    for (ptrdiff_t l = 0; l < L; l++) s[(L + l) * lds + (k)] = b##k[l];

/* X positions (SW apart in the input) by OV vectors of channels, over K
 * taps: tap t of position k reads xp[off[t] + k * SW], its weights are
 * w[t * OV * L ..] (a block of cypool_ov_block's layout); channel l of
 * position k goes to s[l * lds + k]. */
#define CYPOOL_OV_TILE(T, SUF, X, OV, SW)                                            \
static void cypool_ov_tile_##SUF##_x##X##_v##OV##_s##SW(                             \
        ptrdiff_t K, const T *xp, const ptrdiff_t *off, const T *w, T *s,            \
        ptrdiff_t lds)                                                               \
{                                                                                    \
    typedef cypool_vc_v_##SUF V;                                                     \
    typedef T S;                                                                     \
    const ptrdiff_t L = (ptrdiff_t)(sizeof(V) / sizeof(T)), sw = SW, ldw = OV * L;   \
    CYPOOL_OV_P##X(CYPOOL_OV_ZERO##OV)                                               \
    for (ptrdiff_t t = 0; t < K; t++) {                                              \
        const T *xt = xp + off[t];                                                   \
        CYPOOL_OV_W##OV                                                              \
        CYPOOL_OV_P##X(CYPOOL_OV_FMA##OV)                                            \
    }                                                                                \
    CYPOOL_OV_P##X(CYPOOL_OV_STORE##OV)                                              \
}

/* Every tile of one stride and width: X = 1 to 14 by one vector or two
 * (the builds with 16 registers have X <= 12 by two and use X <= 12 and
 * 6). */
#define CYPOOL_OV_TILES_V(T, SUF, OV, SW, G)                                         \
    G(T, SUF, 1, OV, SW) G(T, SUF, 2, OV, SW) G(T, SUF, 3, OV, SW)                   \
    G(T, SUF, 4, OV, SW) G(T, SUF, 5, OV, SW) G(T, SUF, 6, OV, SW)                   \
    G(T, SUF, 7, OV, SW) G(T, SUF, 8, OV, SW) G(T, SUF, 9, OV, SW)                   \
    G(T, SUF, 10, OV, SW) G(T, SUF, 11, OV, SW) G(T, SUF, 12, OV, SW)
#define CYPOOL_OV_TILES(T, SUF, SW, G)                                               \
    CYPOOL_OV_TILES_V(T, SUF, 1, SW, G) G(T, SUF, 13, 1, SW) G(T, SUF, 14, 1, SW)   \
    CYPOOL_OV_TILES_V(T, SUF, 2, SW, G) CYPOOL_OV_WIDE2(T, SUF, SW, G)

#define CYPOOL_OV_CASE(T, SUF, X, OV, SW)                                            \
    case X * 4 + (OV - 1) * 2 + (SW - 1):                                            \
        cypool_ov_tile_##SUF##_x##X##_v##OV##_s##SW(K, xp, off, w, s, lds); return;

#define CYPOOL_OV_TILE_DEFINE(T, SUF)                                                \
CYPOOL_OV_TILES(T, SUF, 1, CYPOOL_OV_TILE)                                           \
CYPOOL_OV_TILES(T, SUF, 2, CYPOOL_OV_TILE)                                           \
static void cypool_ov_tile_##SUF(ptrdiff_t X, ptrdiff_t OV, ptrdiff_t SWc,           \
        ptrdiff_t K, const T *xp, const ptrdiff_t *off, const T *w, T *s,            \
        ptrdiff_t lds)                                                               \
{                                                                                    \
    switch (X * 4 + (OV - 1) * 2 + (SWc - 1)) {                                      \
    CYPOOL_OV_TILES(T, SUF, 1, CYPOOL_OV_CASE)                                       \
    CYPOOL_OV_TILES(T, SUF, 2, CYPOOL_OV_CASE)                                       \
    }                                                                                \
}
#define CYPOOL_OV_FAST 1

#else /* not GCC or clang: one plain loop for every tile; never chosen by cost */
#define CYPOOL_OV_FAST 0
#define CYPOOL_OV_TILE_DEFINE(T, SUF)                                                \
static void cypool_ov_tile_##SUF(ptrdiff_t X, ptrdiff_t OV, ptrdiff_t SWc,           \
        ptrdiff_t K, const T *xp, const ptrdiff_t *off, const T *w, T *s,            \
        ptrdiff_t lds)                                                               \
{                                                                                    \
    const ptrdiff_t n = OV * (CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T));              \
    for (ptrdiff_t k = 0; k < X; k++)                                                \
        for (ptrdiff_t o = 0; o < n; o++) {                                          \
            T a = 0;                                                                 \
            for (ptrdiff_t t = 0; t < K; t++)                                        \
                a += w[t * n + o] * xp[off[t] + k * SWc];                            \
            s[o * lds + k] = a;                                                      \
        }                                                                            \
}
#endif /* __GNUC__ */

/* Ask for pieces k0 .. k1 - 1 of pf (pieces of nbytes, stride bytes apart)
 * to be brought into L2: the source rows of the next band of rows, while
 * this band computes (the rows of an image's channels lie far apart, more
 * streams than the hardware prefetcher follows). */
static inline void cypool_ov_prefetch(const char *pf, ptrdiff_t nbytes, ptrdiff_t stride,
                                      ptrdiff_t k0, ptrdiff_t k1)
{
#if defined(__GNUC__)
    for (ptrdiff_t k = k0; k < k1; k++)
        for (ptrdiff_t b = 0; b < nbytes; b += 64)
            __builtin_prefetch(pf + k * stride + b, 0, 2);
#else
    (void)pf; (void)nbytes; (void)stride; (void)k0; (void)k1;
#endif
}

/* The scratch row's stride (values) for rows of OW outputs: whole 32-byte
 * pieces and a half, so that its Op rows, which the tiles write a column
 * at a time, do not share the L1 cache's sets. */
#define CYPOOL_OV_LDS(OW) ((((OW) + 7) / 8) * 8 + 4)

/* Output rows oy0 .. oy1 - 1 of one image:
 *   out[o * so_c + oy * so_h + ox * so_w] = bias[o] + sum over taps t of
 *       w[t, o] * img[off[t] + oy * rstep + ox * sw]
 * for o < O and ox < OW, the sums in the order of t, the bias added last.
 * w is in cypool_ov_block's layout (Op channels, O rounded up to whole
 * vectors, zero past O); bias may be NULL; sw is 1 or 2; s is a scratch of
 * Op * CYPOOL_OV_LDS(OW) values. Where pf is not NULL, the rows prefetch
 * its pf_n pieces, a share each. */
#define CYPOOL_OV_DEFINE(T, SUF)                                                     \
CYPOOL_OV_TILE_DEFINE(T, SUF)                                                        \
/* One row of n positions (sw apart in the input, from xr) by all Op       \
 * channels, in tiles: channel o of position x to s[o * lds + x]. */        \
static void cypool_ov_row_##SUF(ptrdiff_t n, ptrdiff_t sw, ptrdiff_t K, const T *xr, \
        const ptrdiff_t *off, const T *w, ptrdiff_t Op, T *s, ptrdiff_t lds)         \
{                                                                                    \
    const ptrdiff_t L = CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T);                     \
    for (ptrdiff_t ob = 0; ob < Op;) {                                               \
        const ptrdiff_t nv = Op - ob >= 2 * L ? 2 : 1;                               \
        const ptrdiff_t xmax = nv == 2 ? CYPOOL_OV_XMAX2 : CYPOOL_OV_XMAX1;          \
        const ptrdiff_t pieces = (n + xmax - 1) / xmax;                              \
        ptrdiff_t x0 = 0;                                                            \
        for (ptrdiff_t pc = 0; pc < pieces; pc++) {                                  \
            /* pieces of nearly equal width, none wider than xmax */                 \
            const ptrdiff_t X = (n - x0) / (pieces - pc);                            \
            cypool_ov_tile_##SUF(X, nv, sw, K, xr + x0 * sw, off, w + ob * K,        \
                                 s + ob * lds + x0, lds);                            \
            x0 += X;                                                                 \
        }                                                                            \
        ob += nv * L;                                                                \
    }                                                                                \
}                                                                                    \
                                                                                     \
static void cypool_ov_rows_##SUF(const T *img, const ptrdiff_t *off, ptrdiff_t K,   \
        const T *w, ptrdiff_t Op, ptrdiff_t O, ptrdiff_t oy0, ptrdiff_t oy1,         \
        ptrdiff_t OW, ptrdiff_t rstep, ptrdiff_t sw, const T *bias, T *s, T *out,    \
        ptrdiff_t so_c, ptrdiff_t so_h, ptrdiff_t so_w, const char *pf,              \
        ptrdiff_t pf_bytes, ptrdiff_t pf_stride, ptrdiff_t pf_n)                     \
{                                                                                    \
    const ptrdiff_t lds = CYPOOL_OV_LDS(OW);                                         \
    for (ptrdiff_t oy = oy0; oy < oy1; oy++) {                                       \
        const T *xr = img + oy * rstep;                                              \
        if (pf != NULL)                                                              \
            cypool_ov_prefetch(pf, pf_bytes, pf_stride,                              \
                               pf_n * (oy - oy0) / (oy1 - oy0),                      \
                               pf_n * (oy - oy0 + 1) / (oy1 - oy0));                 \
        cypool_ov_row_##SUF(OW, sw, K, xr, off, w, Op, s, lds);                      \
        for (ptrdiff_t o = 0; o < O; o++) {                                          \
            const T b = bias ? bias[o] : (T)0;                                       \
            const T *src = s + o * lds;                                              \
            T *d = out + o * so_c + oy * so_h;                                       \
            if (so_w == 1)                                                           \
                for (ptrdiff_t ox = 0; ox < OW; ox++)                                \
                    d[ox] = src[ox] + b;                                             \
            else                                                                     \
                for (ptrdiff_t ox = 0; ox < OW; ox++)                                \
                    d[ox * so_w] = src[ox] + b;                                      \
        }                                                                            \
    }                                                                                \
}

CYPOOL_OV_DEFINE(float, f32)
CYPOOL_OV_DEFINE(double, f64)

/* The tap-major weights wt (K rows of Op) in blocks of the tiles' channels:
 * block ob (2L channels while 2L remain, else L) is K rows of its width,
 * at wb + ob * K. */
#define CYPOOL_OV_BLOCK_DEFINE(T, SUF)                                               \
static void cypool_ov_block_##SUF(const T *wt, ptrdiff_t K, ptrdiff_t Op, T *wb)    \
{                                                                                    \
    const ptrdiff_t L = CYPOOL_VC_VBYTES / (ptrdiff_t)sizeof(T);                     \
    for (ptrdiff_t ob = 0; ob < Op;) {                                               \
        const ptrdiff_t n = (Op - ob >= 2 * L ? 2 : 1) * L;                          \
        T *d = wb + ob * K;                                                          \
        for (ptrdiff_t t = 0; t < K; t++)                                            \
            for (ptrdiff_t o = 0; o < n; o++)                                        \
                d[t * n + o] = wt[t * Op + ob + o];                                  \
        ob += n;                                                                     \
    }                                                                                \
}

CYPOOL_OV_BLOCK_DEFINE(float, f32)
CYPOOL_OV_BLOCK_DEFINE(double, f64)

#endif /* CYPOOL_CONV_OVEC_H */
