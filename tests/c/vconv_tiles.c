/* The register tiles of cypool/_kernels/_conv_tiles.h against a plain loop:
 * cypool_vc_pixel for E = 1 to 70 components (every end of E after the
 * vector tiles) and O = 1 to 11 output channels (every last block of 1 to 3
 * channels), from component 0 or 3, with and without the packing buffer and
 * the bias. Built by tests/test_kernel_headers.py once per vector width,
 * including the AVX-512 layout (64-byte vectors, half-vector tiles) emulated
 * by gcc where the CPU lacks AVX-512, so that every build's tiles are
 * checked on any x86-64 machine. Then cypool_vc_rows, the tiles over a
 * list of taps (a block of E of the dense layers, weights (O, D)), for 0
 * to 20 of 25 taps and O = 4 to 16. Then cypool_vc_grid, the standard
 * convolution's real positions gathered from rows of OW out of every Wq,
 * for rows of 1 to 13, 0 to 3 columns to skip, every start and length of
 * up to 3 blocks, and O = 5 to 13; outputs past the length rounded up to
 * a vector must stay untouched. Exits 1 on a wrong value. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "_conv_tiles.h"

#define CHECK(T, SUF)                                                              \
static int check_##SUF(void) {                                                     \
    int bad = 0;                                                                   \
    for (int E = 1; E <= 70; E++)                                                  \
    for (int O = 1; O <= 11; O++)                                                  \
    for (int usepack = 0; usepack < 2; usepack++)                                  \
    for (int usebias = 0; usebias < 2; usebias++) {                                \
        int ntaps = 1 + (E * 7 + O) % 13, ldw = (O + 3) / 4 * 4 + (E % 2) * 4;     \
        int elo = (E > 5 && usepack) ? 3 : 0;                                      \
        T **xs = malloc(ntaps * sizeof(T *)), *w = malloc(ntaps * ldw * sizeof(T)); \
        T **outs = malloc(O * sizeof(T *)), *bias = malloc(O * sizeof(T));         \
        for (int t = 0; t < ntaps; t++) {                                          \
            xs[t] = malloc(E * sizeof(T));                                         \
            for (int e = 0; e < E; e++) xs[t][e] = (T)((rand() % 2001) - 1000) / 300; \
        }                                                                          \
        for (int i = 0; i < ntaps * ldw; i++) w[i] = (T)((rand() % 2001) - 1000) / 700; \
        for (int o = 0; o < O; o++) { outs[o] = malloc(E * sizeof(T));             \
            for (int e = 0; e < E; e++) outs[o][e] = -12345; bias[o] = (T)o + 0.5; } \
        int EBv = sizeof(T) == 4 ? CYPOOL_VC_EB_F32 : CYPOOL_VC_EB_F64;            \
        T *pack = usepack ? malloc(ntaps * EBv * sizeof(T)) : NULL;                \
        const T **pp = usepack ? malloc(ntaps * sizeof(T *)) : NULL;               \
        if (usepack) for (int t = 0; t < ntaps; t++) pp[t] = pack + t * EBv;        \
        cypool_vc_pixel_##SUF(ntaps, (const T *const *)xs, w, ldw, elo, E, O, outs,  \
                              usebias ? bias : NULL, pack, pp);                    \
        for (int o = 0; o < O; o++)                                                \
            for (int e = 0; e < E; e++) {                                          \
                double want = e < elo ? -12345 : 0;                                \
                if (e >= elo) { for (int t = 0; t < ntaps; t++) want += (double)w[t * ldw + o] * xs[t][e]; \
                    if (usebias && e == 0) want += bias[o]; }                      \
                if (fabs(outs[o][e] - want) > 1e-3 * (1 + fabs(want))) {           \
                    if (bad < 5) printf(#SUF " E=%d O=%d pack=%d bias=%d o=%d e=%d got %g want %g\n", \
                                        E, O, usepack, usebias, o, e, (double)outs[o][e], want); \
                    bad++; }                                                       \
            }                                                                      \
        for (int t = 0; t < ntaps; t++) free(xs[t]);                               \
        for (int o = 0; o < O; o++) free(outs[o]);                                 \
        free(xs); free(w); free(outs); free(bias); free(pack); free(pp);           \
    }                                                                              \
    return bad;                                                                    \
}
CHECK(float, f32)
CHECK(double, f64)

#define CHECK_ROWS(T, SUF)                                                         \
static int check_rows_##SUF(void) {                                                \
    int bad = 0, EBv = sizeof(T) == 4 ? CYPOOL_VC_EB_F32 : CYPOOL_VC_EB_F64, D = 25; \
    for (int n = 0; n <= 20; n++)                                                  \
    for (int O = 4; O <= 16; O += 4)                                               \
    for (int usebias = 0; usebias < 2; usebias++) {                                \
        int ldw = D + 3, e0 = 5, E = e0 + EBv + 2;                                 \
        T *w = malloc(O * ldw * sizeof(T)), *pack = malloc((n + 1) * EBv * sizeof(T)); \
        T **outs = malloc(O * sizeof(T *)), *bias = malloc(O * sizeof(T));         \
        const T **pp = malloc((n + 1) * sizeof(T *));                              \
        ptrdiff_t rowi[20];                                                        \
        for (int i = 0; i < O * ldw; i++) w[i] = (T)((rand() % 2001) - 1000) / 700; \
        for (int t = 0; t < n; t++) {                                              \
            rowi[t] = (t * 7 + n) % D; pp[t] = pack + t * EBv;                      \
            for (int e = 0; e < EBv; e++) pack[t * EBv + e] = (T)((rand() % 2001) - 1000) / 300; \
        }                                                                          \
        for (int o = 0; o < O; o++) { outs[o] = malloc(E * sizeof(T));             \
            for (int e = 0; e < E; e++) outs[o][e] = -12345; bias[o] = (T)o + 0.5; } \
        cypool_vc_rows_##SUF(n, (const T *const *)pp, 0, rowi, w, ldw, e0, O, outs, \
                             usebias ? bias : NULL);                               \
        for (int o = 0; o < O; o++)                                                \
            for (int e = 0; e < E; e++) {                                          \
                double want = -12345;                                              \
                if (e >= e0 && e < e0 + EBv) {                                     \
                    want = 0;                                                      \
                    for (int t = 0; t < n; t++) want += (double)w[o * ldw + rowi[t]] * pack[t * EBv + e - e0]; \
                    if (usebias && e == e0) want += bias[o];                       \
                }                                                                  \
                if (fabs(outs[o][e] - want) > 1e-3 * (1 + fabs(want))) {           \
                    if (bad < 5) printf(#SUF " rows n=%d O=%d bias=%d o=%d e=%d got %g want %g\n", \
                                        n, O, usebias, o, e, (double)outs[o][e], want); \
                    bad++; }                                                       \
            }                                                                      \
        for (int o = 0; o < O; o++) free(outs[o]);                                 \
        free(w); free(pack); free(outs); free(bias); free(pp);                     \
    }                                                                              \
    return bad;                                                                    \
}
CHECK_ROWS(float, f32)
CHECK_ROWS(double, f64)

#define CHECK_GRID(T, SUF)                                                         \
static int check_grid_##SUF(void) {                                                \
    int bad = 0, EBv = sizeof(T) == 4 ? CYPOOL_VC_EB_F32 : CYPOOL_VC_EB_F64;       \
    int VL = EBv / 3, ntaps = 7;                                                    \
    for (int OW = 1; OW <= 13; OW++)                                               \
    for (int skip = 0; skip <= 3; skip++)                                          \
    for (int O = 5; O <= 13; O += 4) {                                             \
        int Wq = OW + skip, rows = 3 * EBv / OW + 2, R = rows * OW, ldw = (O + 3) / 4 * 4; \
        int cap = 3 * EBv + VL;                                                    \
        T **xs = malloc(ntaps * sizeof(T *)), *w = malloc(ntaps * ldw * sizeof(T)); \
        T **outs = malloc(O * sizeof(T *)), *pack = malloc(ntaps * EBv * sizeof(T)); \
        const T **pp = malloc(ntaps * sizeof(T *));                                \
        for (int t = 0; t < ntaps; t++) {                                          \
            xs[t] = malloc(rows * Wq * sizeof(T)); pp[t] = pack + t * EBv;          \
            for (int e = 0; e < rows * Wq; e++)                                    \
                /* the skipped columns hold NaN: reading one shows */          \
                xs[t][e] = e % Wq < OW ? (T)((rand() % 2001) - 1000) / 300 : (T)NAN; \
        }                                                                          \
        for (int i = 0; i < ntaps * ldw; i++) w[i] = (T)((rand() % 2001) - 1000) / 700; \
        for (int o = 0; o < O; o++) outs[o] = malloc(cap * sizeof(T));             \
        for (int r_lo = 0; r_lo <= OW + 1 && r_lo < R; r_lo++)                     \
        for (int nr = 1; nr <= 3 * EBv && r_lo + nr <= R; nr += (nr < 2 * EBv ? 1 : 5)) { \
            int wrote = (nr + VL - 1) / VL * VL;                                   \
            if (CYPOOL_VC_HALF_TAIL && nr % EBv && nr % EBv <= EBv / 6)           \
                wrote = nr / EBv * EBv + EBv / 6;                                  \
            for (int o = 0; o < O; o++) for (int k = 0; k < cap; k++) outs[o][k] = -12345; \
            cypool_vc_grid_##SUF(ntaps, (const T *const *)xs, w, ldw, r_lo, nr, OW, Wq, O, \
                                 outs, pack, pp);                                  \
            for (int o = 0; o < O; o++)                                            \
                for (int k = 0; k < cap; k++) {                                    \
                    double want = -12345, got = outs[o][k];                        \
                    if (k < nr) {                                                  \
                        int r = r_lo + k, at = r / OW * Wq + r % OW;               \
                        want = 0;                                                  \
                        for (int t = 0; t < ntaps; t++) want += (double)w[t * ldw + o] * xs[t][at]; \
                    } else if (k < wrote) continue;  /* past nr, in a vector: any value */ \
                    if (!(fabs(got - want) <= 1e-3 * (1 + fabs(want)))) {          \
                        if (bad < 5) printf(#SUF " grid OW=%d Wq=%d O=%d r_lo=%d nr=%d o=%d k=%d got %g want %g\n", \
                                            OW, Wq, O, r_lo, nr, o, k, got, want); \
                        bad++; }                                                   \
                }                                                                  \
        }                                                                          \
        for (int t = 0; t < ntaps; t++) free(xs[t]);                               \
        for (int o = 0; o < O; o++) free(outs[o]);                                 \
        free(xs); free(w); free(outs); free(pack); free(pp);                       \
    }                                                                              \
    return bad;                                                                    \
}
CHECK_GRID(float, f32)
CHECK_GRID(double, f64)

int main(void) {
    int bad = check_f32() + check_f64() + check_rows_f32() + check_rows_f64()
              + check_grid_f32() + check_grid_f64();
    printf("VBYTES=%d HALF_TAIL=%d: %s (%d bad)\n", CYPOOL_VC_VBYTES, CYPOOL_VC_HALF_TAIL, bad ? "FAIL" : "ok", bad);
    return bad != 0;
}
