#!/usr/bin/env bash
# Builds Plexus on this machine (Debian 12, as root) with the system's copies of the libraries in
# .deps/sysdeps.tar.xz hidden, so that only the carried ones can be found: what the GPU machine's
# build does where its image lacks them (tests/gpu/stage_deps.sh, run_owed.sh's build phase).
# Then runs the suite of that build (CTEST_REGEX: all of it by default). Not part of the suite
# (a build of its own, about 15 minutes on 2 cores); run it after changing the dependencies or
# the staging:
#
#   bash tests/gpu/stage_deps.sh && bash tests/gpu/check_carried_build.sh [BUILD_DIR] [CTEST_REGEX]
#
# Hidden (inside a private mount namespace, `unshare -m`): Boost's, spdlog's, fmt's, CLI11's,
# Catch2's, toml++'s, zlib's and OpenBLAS's headers, CMake packages and libraries (but the
# zlib runtime every system has), and the Fortran runtime.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${1:-/tmp/plexus-carried-build}
regex=${2:-.}
[[ -f .deps/sysdeps.tar.xz ]] || { echo "no .deps/sysdeps.tar.xz: run tests/gpu/stage_deps.sh" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "needs root (unshare -m and bind mounts)" >&2; exit 2; }

if [[ ${PLEXUS_IN_NAMESPACE:-} != 1 ]]; then
  exec env PLEXUS_IN_NAMESPACE=1 unshare -m --propagation private bash "$0" "$build" "$regex"
fi

# A folder of links to every entry of $1 but those named in the rest, mounted over $1 (the
# original stays reachable through a bind mount of its own, where the links point).
hide_in() {
  local dir=$1
  shift
  local real farm
  real=$(mktemp -d) farm=$(mktemp -d)
  mount --bind "$dir" "$real"
  for e in "$real"/* "$real"/.[!.]*; do
    [[ -e $e || -L $e ]] || continue
    local name=${e##*/} skip=0
    for pat in "$@"; do
      # shellcheck disable=SC2053
      [[ $name == $pat ]] && skip=1
    done
    ((skip)) || ln -s "$e" "$farm/$name"
  done
  mount --bind "$farm" "$dir"
}
# Parents first: a folder's links lead into the bind mount of the original, which does not carry
# the mounts below it, so a child hidden before its parent would show again.
hide_in /usr/include boost spdlog fmt CLI catch2 'toml++' zlib.h zconf.h 'cblas*' f77blas.h \
  'openblas*'
hide_in /usr/include/x86_64-linux-gnu 'openblas*' 'cblas*' f77blas.h
hide_in /usr/lib/x86_64-linux-gnu 'libopenblas*' 'libblas*' 'liblapack*' blas lapack \
  'openblas-*' 'libspdlog*' 'libfmt*' 'libgfortran*' 'libquadmath*' libz.so libz.a 'libtomlplusplus*'
hide_in /usr/lib/x86_64-linux-gnu/cmake 'Boost*' 'boost_*' spdlog fmt openblas tomlplusplus
hide_in /usr/lib/cmake Catch2
hide_in /usr/share/cmake CLI11

# Unpacked beside the build, not in .deps (which the GPU call carries whole).
sys=$build.sys
rm -rf "$sys" && mkdir -p "$sys" && tar -C "$sys" -xJf .deps/sysdeps.tar.xz
prefixes=$(printf "%s;" "$sys"/*/ | sed 's|/;|;|g')
prefixes=${prefixes%;}
echo "== configure (system libraries hidden)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPLEXUS_CUDA=OFF \
  -DPLEXUS_CUDA_EMULATOR=OFF -DCMAKE_PREFIX_PATH="$root/.deps" -DPLEXUS_FALLBACK_PREFIXES="$prefixes" \
  > "$build.configure.log" 2>&1 ||
  { tail -30 "$build.configure.log"; exit 1; }
grep -E 'OpenBLAS:|Catch2|Found' "$build.configure.log" || true
found=$(grep -E '^(Boost_DIR|spdlog_DIR|fmt_DIR|CLI11_DIR|Catch2_DIR|ZLIB_LIBRARY_RELEASE|PLEXUS_OPENBLAS_LIBRARY)[:=]' \
  "$build/CMakeCache.txt")
echo "$found"
# Every one of them must be the carried copy.
bad=$(grep -v "$sys/" <<< "$found" || true)
[[ -z $bad ]] || { echo "found outside the carried prefixes: $bad" >&2; exit 1; }
echo "== build"
cmake --build "$build" -j"$(nproc)" > "$build.build.log" 2>&1 || { grep -E 'error' -A5 "$build.build.log" | head -40; exit 1; }
tail -1 "$build.build.log"
echo "== what the plugins and programs load (no LD_LIBRARY_PATH)"
for f in "$build"/lib/plexus/plugins/libplexus-cpu.so "$build"/bin/plexus; do
  echo "$f:"
  ldd "$f" | grep -E 'openblas|gfortran|quadmath|spdlog|fmt|libz|not found' || true
done
if ldd "$build"/lib/plexus/plugins/libplexus-cpu.so "$build"/bin/plexus | grep -q 'not found'; then
  echo "a library was not found" >&2
  exit 1
fi
"$build"/bin/plexus info | head -12
echo "== tests: $regex"
ctest --test-dir "$build" -j"$(nproc)" -R "$regex" --timeout 600 2>&1 | tail -15
