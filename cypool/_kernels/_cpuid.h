/* The CPU features the kernel variants need, read from CPUID and XGETBV:
 * what the processor has and the operating system saves on a context
 * switch (AVX and AVX-512 state). cypool/_backend.py asks this before it
 * picks a variant, so that the choice does not depend on which features a
 * numpy version happens to report. Compiled into every variant, and only
 * ever called from one the CPU runs (the baseline's code is plain x86-64).
 *
 * cypool_cpuid_bits() returns a bit set in the order of CYPOOL_CPU_NAMES,
 * with bit 31 set when the query was possible at all (x86-64 with a
 * compiler this file knows); 0 elsewhere. */
#ifndef CYPOOL_CPUID_H
#define CYPOOL_CPUID_H
#include <stdint.h>

#define CYPOOL_CPU_NAMES "AVX AVX2 F16C FMA3 BMI BMI2 LZCNT MOVBE AVX512F AVX512CD AVX512VL AVX512BW AVX512DQ"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
static inline void cypool_cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static inline uint64_t cypool_xgetbv(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#define CYPOOL_HAVE_CPUID 1
#elif defined(_M_X64) && defined(_MSC_VER)
#include <intrin.h>
#include <immintrin.h>
static inline void cypool_cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    r[0] = (unsigned)v[0]; r[1] = (unsigned)v[1]; r[2] = (unsigned)v[2]; r[3] = (unsigned)v[3];
}
static inline uint64_t cypool_xgetbv(void) { return _xgetbv(0); }
#define CYPOOL_HAVE_CPUID 1
#else
#define CYPOOL_HAVE_CPUID 0
#endif

static inline uint32_t cypool_cpuid_bits(void)
{
#if CYPOOL_HAVE_CPUID
    unsigned r1[4], r7[4] = {0, 0, 0, 0}, rx[4] = {0, 0, 0, 0}, r0[4], r8[4];
    uint32_t bits = 1u << 31;
    cypool_cpuid(0, 0, r0);
    cypool_cpuid(1, 0, r1);
    if (r0[0] >= 7)
        cypool_cpuid(7, 0, r7);
    cypool_cpuid(0x80000000u, 0, r8);
    if (r8[0] >= 0x80000001u)
        cypool_cpuid(0x80000001u, 0, rx);
    int osxsave = (r1[2] >> 27) & 1;
    uint64_t xcr0 = osxsave ? cypool_xgetbv() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6;             /* XMM and YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    int avx = os_avx && ((r1[2] >> 28) & 1);
    int f[13] = {
        avx,
        avx && ((r7[1] >> 5) & 1),        /* AVX2 */
        avx && ((r1[2] >> 29) & 1),       /* F16C */
        avx && ((r1[2] >> 12) & 1),       /* FMA3 */
        (r7[1] >> 3) & 1,                 /* BMI1 */
        (r7[1] >> 8) & 1,                 /* BMI2 */
        (rx[2] >> 5) & 1,                 /* LZCNT (ABM) */
        (r1[2] >> 22) & 1,                /* MOVBE */
        os_avx512 && ((r7[1] >> 16) & 1), /* AVX512F */
        os_avx512 && ((r7[1] >> 28) & 1), /* AVX512CD */
        os_avx512 && ((r7[1] >> 31) & 1), /* AVX512VL */
        os_avx512 && ((r7[1] >> 30) & 1), /* AVX512BW */
        os_avx512 && ((r7[1] >> 17) & 1), /* AVX512DQ */
    };
    for (int i = 0; i < 13; i++)
        bits |= (uint32_t)(f[i] != 0) << i;
    return bits;
#else
    return 0;
#endif
}
#endif
