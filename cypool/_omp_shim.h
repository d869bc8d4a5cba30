/* Lets the kernels call the few OpenMP runtime functions they need whether or
 * not the build found OpenMP: without it they are serial and say so. */
#ifndef CYPOOL_OMP_SHIM_H
#define CYPOOL_OMP_SHIM_H
#ifdef _OPENMP
#include <omp.h>
#define CYPOOL_HAVE_OPENMP 1
#define CYPOOL_OPENMP_VERSION _OPENMP
#else
#define CYPOOL_HAVE_OPENMP 0
#define CYPOOL_OPENMP_VERSION 0
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif
#endif
