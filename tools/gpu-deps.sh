#!/usr/bin/env bash
# Builds .gpu-deps/: the Debian 12 libraries tessera's build needs, for a GPU machine that
# has a compiler, CUDA, cmake, ninja and python3 but no apt, no network and none of these
# -dev packages. Run it HERE (Debian 12 with apt); tools/gpu-check.sh uses the result there.
#
#   tools/gpu-deps.sh              # downloads (apt-get download, no install) and extracts
#   GPU_DEPS_MPI=1 tools/gpu-deps.sh   # also OpenMPI (headers, libs, mpirun; untested)
#
# Result:
#   .gpu-deps/sysroot/             the packages unpacked with dpkg -x (usr/include, usr/lib/...),
#                                  docs, man pages and unused static libraries removed
#   .gpu-deps/sysroot.tar.xz       the same tree, compressed: THIS is what to carry to the GPU
#                                  machine (gpu-check.sh unpacks it when sysroot/ is missing).
#                                  The tree is ~84 MiB, too big to carry as is (libopenblas
#                                  36 MiB and oneDNN 39 MiB, both needed: the CPU backend is
#                                  the GPU tests' reference); the archive is ~13 MiB.
#   .gpu-deps/debs/                the downloaded .deb files (a cache for reruns)
#   .gpu-deps/packages.txt         package=version list of what is inside
#
# Not included, expected on the GPU machine: libc, libstdc++/libgcc_s and libgomp (they come
# with the compiler; the libraries ask for GLIBC_2.34 and GLIBCXX_3.4.29 at most, which the
# script prints), CUDA and NCCL. MPI is left out unless GPU_DEPS_MPI=1 (untested).
set -euo pipefail

ROOT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="${GPU_DEPS_DIR:-$ROOT_DIR/.gpu-deps}"
SYSROOT="$DEPS/sysroot"
DEBS="$DEPS/debs"

# From the Makefile's DEB_PACKAGES, the ones the build links or includes, plus their runtime
# libraries (dpkg -x resolves nothing) and pkg-config (CMake's FindPkgConfig, for xxhash).
PACKAGES=(
  libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0  # BLAS (cblas.h, libopenblas.so)
  libdnnl-dev libdnnl2                                                    # oneDNN
  ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers                  # oneDNN needs libOpenCL; its CMake config finds OpenCL
  libfmt-dev libfmt9
  libgtest-dev libgmock-dev                                               # static libs + CMake config
  libcli11-dev nlohmann-json3-dev                                         # header-only
  libtomlplusplus-dev libtomlplusplus3
  libxxhash-dev libxxhash0
  libicu-dev libicu72 icu-devtools                                        # tokenizers: Unicode properties
  libsentencepiece-dev libsentencepiece0                                  # tokenizers: SentencePiece models
  pkgconf-bin libpkgconf3                                                 # the pkg-config program
)
if [[ "${GPU_DEPS_MPI:-0}" == 1 ]]; then
  PACKAGES+=(libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
    libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
    libnl-route-3-200 libefa1 libnuma1 libudev1 libxnvctrl0 libcurl3-gnutls libmunge2 zlib1g)
fi

command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
  { echo "gpu-deps.sh: needs apt-get and dpkg (run it on the Debian 12 development machine)" >&2; exit 1; }

mkdir -p "$DEBS"
cd "$DEBS"
missing=()
for p in "${PACKAGES[@]}"; do
  v="$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')"
  if [[ -z "$v" || "$v" == "(none)" ]]; then
    echo "gpu-deps.sh: apt knows no candidate for $p (apt-get update?)" >&2
    exit 1
  fi
  # apt-get download names files <name>_<version with ':' as %3a>_<arch>.deb
  if ! ls "${p}_${v//:/%3a}_"*.deb >/dev/null 2>&1; then missing+=("$p=$v"); fi
done
if ((${#missing[@]})); then
  echo "gpu-deps.sh: downloading ${#missing[@]} packages" >&2
  apt-get download -q "${missing[@]}" || {
    echo "gpu-deps.sh: apt-get download failed; trying apt-get update first" >&2
    SUDO=$([[ "$(id -u)" == 0 ]] || echo sudo)
    $SUDO apt-get update -q >&2
    apt-get download -q "${missing[@]}"
  }
fi

rm -rf "$SYSROOT"
mkdir -p "$SYSROOT"
: >"$DEPS/packages.txt"
for p in "${PACKAGES[@]}"; do
  v="$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')"
  deb="$(ls "${p}_${v//:/%3a}_"*.deb | head -1)"
  dpkg -x "$deb" "$SYSROOT"
  echo "$p=$v" >>"$DEPS/packages.txt"
done

# Trim: documentation, and static libraries nothing links (gtest/gmock are static-only in
# Debian and stay).
rm -rf "$SYSROOT/usr/share/doc" "$SYSROOT/usr/share/man" "$SYSROOT/usr/share/lintian" \
  "$SYSROOT/usr/share/bug" "$SYSROOT/usr/share/info" "$SYSROOT/usr/share/gcc" "$SYSROOT/usr/share/gdb"
find "$SYSROOT" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
# OpenBLAS's LAPACK and reference-BLAS sonames: tessera links libopenblas.so only.
rm -f "$SYSROOT"/usr/lib/x86_64-linux-gnu/openblas-pthread/{liblapack,libblas}.so*
# dpkg -x sets up no alternatives: libopenblas.so in openblas-pthread/ is the real library
# (CMake's FindBLAS finds it there through CMAKE_LIBRARY_PATH).

# Every DT_NEEDED of the shipped libraries and programs must be in the sysroot or be one
# of the compiler's/C library's.
BASE_LIBS='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libgomp|ld-linux-x86-64)\.so'
unresolved=0
while IFS= read -r f; do
  file -b "$f" | grep -q '^ELF' || continue
  while IFS= read -r lib; do
    [[ "$lib" =~ $BASE_LIBS ]] && continue
    if [[ -z "$(find "$SYSROOT" -name "$lib" -print -quit)" ]]; then
      echo "gpu-deps.sh: $f needs $lib, which is not in the sysroot" >&2
      unresolved=1
    fi
  done < <(objdump -p "$f" 2>/dev/null | awk '/NEEDED/ {print $2}')
done < <(find "$SYSROOT" -type f \( -name '*.so*' -o -path '*/bin/*' \))
# What they ask of the GPU machine's C and C++ runtimes.
glibc="$(find "$SYSROOT" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null |
  grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
glibcxx="$(find "$SYSROOT" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null |
  grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)"

rm -f "$DEPS/sysroot.tar.xz"
tar -C "$DEPS" -cJf "$DEPS/sysroot.tar.xz.tmp" sysroot packages.txt
mv "$DEPS/sysroot.tar.xz.tmp" "$DEPS/sysroot.tar.xz"

echo "gpu-deps.sh: $(wc -l <"$DEPS/packages.txt") packages in $SYSROOT ($(du -sh "$SYSROOT" | cut -f1)); " \
  "archive $DEPS/sysroot.tar.xz ($(du -sh "$DEPS/sysroot.tar.xz" | cut -f1))"
echo "gpu-deps.sh: the libraries need ${glibc:-?} and ${glibcxx:-?} on the GPU machine"
echo "gpu-deps.sh: carry .gpu-deps/sysroot.tar.xz to the GPU machine, then run tools/gpu-check.sh there"
exit "$unresolved"
