"""Build script for cypool's compiled kernels.

Everything about *how* the extension is compiled lives here:

* an OpenMP probe: a tiny program is compiled and linked with the platform's
  OpenMP flags; when that fails the kernels are built serially and a warning
  is printed (the install never fails for lack of OpenMP);
* portable code generation by default: the kernels are compiled once per
  instruction-set level (baseline, AVX2+FMA and AVX-512 on x86-64) and the
  best one is chosen at import; ``-march=native`` only when the user sets
  ``CYPOOL_NATIVE=1`` for a source build, which then builds that one variant
  (the result may crash on another CPU);
* the Cython compiler directives, set once for every module;
* debug (``CYPOOL_DEBUG=1``) and sanitizer (``CYPOOL_SANITIZE=...``) builds.
"""
import os
import shutil
import sys
import sysconfig
import tempfile
import textwrap
import warnings

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d %d\\n", n, omp_get_max_threads());
        return n > 0 ? 0 : 1;
    }
    """
)


def openmp_flags(compiler_type):
    """(compile args, link args) that switch OpenMP on for this compiler."""
    if compiler_type == "msvc":
        return ["/openmp"], []
    if sys.platform == "darwin":
        # Apple clang needs libomp (brew install libomp) and this spelling.
        prefix = os.environ.get("CYPOOL_LIBOMP_PREFIX", "/opt/homebrew/opt/libomp")
        return (
            ["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"],
            [f"-L{prefix}/lib", "-lomp"],
        )
    # -ldl: _team.h finds libgomp's functions with dlopen (CYPOOL_TEAM=libgomp),
    # which glibc before 2.34 keeps in libdl.
    return ["-fopenmp"], ["-fopenmp"] + (["-ldl"] if sys.platform.startswith("linux") else [])


def probe_openmp(compiler):
    """Return True when a small OpenMP program compiles and links."""
    cflags, ldflags = openmp_flags(compiler.compiler_type)
    tmp = tempfile.mkdtemp(prefix="cypool-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
        compiler.link_executable(objs, "probe", output_dir=tmp, extra_postargs=ldflags)
        return True
    except Exception:  # any compile or link error means "no OpenMP"
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# CYPOOL_DEBUG=1: Cython's bounds, wraparound and initialisation checks on,
# C asserts kept, -O1 -g. CYPOOL_SANITIZE=address,undefined (or either):
# instrumented with those sanitizers (see CONTRIBUTING.md, "Sanitizers").
DEBUG = os.environ.get("CYPOOL_DEBUG") == "1"
SANITIZE = os.environ.get("CYPOOL_SANITIZE", "").strip()


def sanitizer_flags():
    """(compile args, link args) for CYPOOL_SANITIZE, a comma-separated list
    of address and undefined."""
    if not SANITIZE:
        return [], []
    kinds = [k.strip() for k in SANITIZE.split(",") if k.strip()]
    unknown = set(kinds) - {"address", "undefined"}
    if unknown:
        raise SystemExit(f"CYPOOL_SANITIZE: unknown sanitizer(s) {sorted(unknown)}; "
                         "use address, undefined or address,undefined")
    flag = "-fsanitize=" + ",".join(kinds)
    compile_args = [flag, "-fno-omit-frame-pointer", "-g"]
    if "undefined" in kinds:
        compile_args.append("-fno-sanitize-recover=undefined")  # a finding stops the process
    return compile_args, [flag]


def base_compile_args(compiler_type):
    if compiler_type == "msvc":
        return ["/Od", "/Zi"] if DEBUG else ["/O2"]
    if DEBUG:
        args = ["-O1", "-g", "-UNDEBUG"]
    elif SANITIZE:
        # -O1, as the sanitizers' authors advise: it keeps every instrumented
        # access, and -O3's instrumented compile took about twice as long.
        args = ["-O1"]
    else:
        # No debug information: Python's own CFLAGS ask for -g, which added
        # about 18 s to each variant's compile and made the wheel 4.6 times
        # larger (CONTRIBUTING.md). Debug and sanitizer builds keep it.
        args = ["-O3", "-g0"]
    # -Wmaybe-uninitialized: about 180 false reports, nearly all on the
    # private copies Cython's parallel() blocks make of loop variables, and
    # 7 s of compile time per variant.
    args += ["-fno-math-errno", "-fno-trapping-math", "-Wno-tautological-compare",
             "-Wno-maybe-uninitialized"]
    if os.environ.get("CYPOOL_VEC_REPORT") == "1":
        args.append("-fopt-info-vec-optimized")
    return args + sanitizer_flags()[0]


class BuildExt(build_ext):
    """build_ext that adds OpenMP (when it works) and the compile flags,
    and compiles the variants in parallel (one per CPU, as ``-j``)."""

    # The kind of build whose objects build/ holds: a build of another kind
    # recompiles everything rather than reuse them.
    FLAVOUR_FILE = os.path.join("build", "cypool-flavour")

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1
        self.flavour = " ".join(f"{k}={os.environ.get(k)}" for k in (
            "CYPOOL_DEBUG", "CYPOOL_SANITIZE", "CYPOOL_NO_OPENMP", "CYPOOL_VEC_REPORT", "CFLAGS"))
        try:
            with open(self.FLAVOUR_FILE) as f:
                same = f.read() == self.flavour
        except OSError:
            same = False
        if DEBUG or SANITIZE or not same:
            self.force = True

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        use_omp = os.environ.get("CYPOOL_NO_OPENMP") != "1" and probe_openmp(self.compiler)
        if not use_omp:
            warnings.warn(
                "cypool: OpenMP was not found (or CYPOOL_NO_OPENMP=1); "
                "building serial kernels. They are correct but use one thread."
            )
        cflags, ldflags = openmp_flags(ctype) if use_omp else ([], [])
        for ext in self.extensions:
            # The variant's own flags come last so that they win.
            ext.extra_compile_args = base_compile_args(ctype) + cflags + ext.extra_compile_args
            ext.extra_link_args = ldflags + sanitizer_flags()[1] + ext.extra_link_args
        super().build_extensions()
        os.makedirs(os.path.dirname(self.FLAVOUR_FILE), exist_ok=True)
        with open(self.FLAVOUR_FILE, "w") as f:
            f.write(self.flavour)
        self._remove_stale_variants()

    def _remove_stale_variants(self):
        """Delete kernel modules of variants this build did not make (say a
        _kernels_native left in build/ or the source tree by an earlier
        CYPOOL_NATIVE=1 build): _backend would load them, and a native one
        may crash on another CPU."""
        made = {os.path.basename(self.get_ext_fullpath(ext.name)) for ext in self.extensions}
        suffix = os.path.splitext(next(iter(made)))[1]
        folder = os.path.dirname(self.get_ext_fullpath(self.extensions[0].name))
        for name in os.listdir(folder):
            if name.startswith("_kernels_") and name.endswith(suffix) and name not in made:
                os.remove(os.path.join(folder, name))


DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,  # the Python layer validates every shape and index
    "wraparound": False,
    "initializedcheck": False,
    "cdivision": True,
    "nonecheck": False,
    "embedsignature": True,
    # A free-threaded Python keeps its GIL off when it imports the kernels.
    # Their shared state is safe under true parallelism: the repeat memo
    # (_conv_memo.pxi) behind a mutex, the team record per thread, the
    # crowded-spell clock in atomics (_omp_shim.h); CONTRIBUTING.md, "Threads".
    "freethreading_compatible": True,
}
if DEBUG:
    DIRECTIVES.update(boundscheck=True, wraparound=True, initializedcheck=True)

def variants():
    """(name, extra compile args) of each instruction-set level to build.

    x86-64 gets the portable baseline, an AVX2+FMA (x86-64-v3) build and an
    AVX-512 (x86-64-v4) build; cypool/_backend.py picks one at import from
    the CPU's features. The AVX-512 build matters for the convolution, whose
    register tiles (_conv_tiles.h) use 16-float vectors there; its other
    loops keep gcc's 256-bit auto-vectorisation. It compiles the
    convolution family only (_kernels_avx512.pyx): the max-pool and argmax
    kernels run from the AVX2 build, which measured faster for them.
    Other architectures get the baseline only.
    """
    # The target's architecture: sysconfig's platform is the target's in a
    # cross build (tools/aarch64.sh), where platform.machine() is the host's.
    machine = sysconfig.get_platform().rsplit("-", 1)[-1].lower()
    if os.environ.get("CYPOOL_NATIVE") == "1" and sys.platform != "win32":
        # One variant for the building machine, ISA and tuning (gcc's
        # -march=native); it is loaded whenever it is there.
        return [("native", ["-march=native"])]
    if os.environ.get("CYPOOL_BASELINE_ONLY") == "1" or machine not in ("x86_64", "amd64"):
        return [("baseline", [])]
    if sys.platform == "win32":
        return [("baseline", []), ("avx2", ["/arch:AVX2"])]
    return [
        ("baseline", []),
        ("avx2", ["-march=x86-64-v3", "-mtune=generic"]),
        ("avx512", ["-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=256"]),
    ]


def compile_args(variant, compiler_type="unix", openmp=True):
    """Every C flag a variant's kernels are compiled with (bench/ab_kernels.py
    builds its A/B modules with these)."""
    omp = openmp_flags(compiler_type)[0] if openmp else []
    return base_compile_args(compiler_type) + omp + dict(variants())[variant]


def _generated_c_is_current(c_files):
    """Whether every c_file exists and is newer than all of cypool's kernel
    sources and this file (its directives). Cython's own dependency check
    would also compare against Cython's .pxd files, which are new in every
    isolated build environment pip makes: without this, each `pip install .`
    regenerated and recompiled everything, even when build/ held the
    objects of the same sources."""
    if not all(os.path.exists(c) for c in c_files):
        return False
    sources = [os.path.join(folder, f) for folder in ("cypool", KERNEL_DIR)
               for f in os.listdir(folder) if f.endswith((".pyx", ".pxi", ".pxd", ".h"))]
    newest = max(os.path.getmtime(f) for f in sources + [__file__])
    return newest < min(os.path.getmtime(c) for c in c_files)


# The kernel sources (.pxi, .h): cypool/_kernels_<level>.pyx includes them
# from here, and the C compiler finds the headers here.
KERNEL_DIR = os.path.join("cypool", "_kernels")


def _cpu_lacks_avx512():
    """Whether this Linux machine's CPU lacks a feature the AVX-512 variant
    needs (/proc/cpuinfo's flags; those cypool/_backend.py checks); False
    where that cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), None)
    except OSError:
        return False
    need = ("avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq")
    return flags is not None and not set(need) <= set(flags)


def kernel_extensions():
    """One extension per variant: cythonized, or from the C a previous
    build generated from the same sources (then setuptools also skips the
    compile when build/ holds a newer object: the second of the Quick
    start commands builds nothing). A sanitizer build, made to run the
    tests on this machine, leaves out the AVX-512 variant where this CPU
    cannot run it: its instrumented compile outlasts the other two's."""
    headers = [os.path.join(KERNEL_DIR, f) for f in os.listdir(KERNEL_DIR) if f.endswith(".h")]
    built = [(name, args) for name, args in variants()
             if not (SANITIZE and name == "avx512" and _cpu_lacks_avx512())]
    extensions = [
        Extension(f"cypool._kernels_{name}", [f"cypool/_kernels_{name}.pyx"],
                  include_dirs=[KERNEL_DIR], extra_compile_args=args, depends=headers)
        for name, args in built
    ]
    annotate = os.environ.get("CYPOOL_ANNOTATE") == "1"
    c_files = [f"cypool/_kernels_{name}.c" for name, _ in built]
    if not (DEBUG or annotate) and _generated_c_is_current(c_files):
        for ext, c in zip(extensions, c_files):
            ext.sources = [c]
        return extensions
    return cythonize(
        extensions,
        nthreads=os.cpu_count() or 1,  # one process per variant
        compiler_directives=DIRECTIVES,
        annotate=annotate,
        force=True,  # some source is newer than the C: all of it is regenerated
        # Debug directives: C of its own, away from the release build's
        **({"build_dir": "build/cython-debug"} if DEBUG else {}),
    )


if __name__ == "__main__":  # pip and setuptools run this file as __main__
    setup(ext_modules=kernel_extensions(), cmdclass={"build_ext": BuildExt})
