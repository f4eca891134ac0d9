#!/usr/bin/env bash
# Stages, on the dev machine (Debian 12), what a call to the GPU machine carries in `.deps`
# (run(..., carry=[".deps"]); ../shared/GPU.md):
#   .deps/include/toml++   toml++'s headers (neither GPU image has toml++)
#   .deps/bench            the peer's PyTorch scripts (../shared/bench)
#   .deps/fashion-mnist    the data set (Debian's dataset-fashion-mnist)
#   .deps/sysdeps.tar.xz   the C++ libraries the build needs, from this machine's Debian packages,
#                          one install prefix each (boost, spdlog with fmt, cli11, catch2, zlib,
#                          openblas with its Fortran runtime): what the GPU image has not got.
# The workplace's `cuda` image (the H200's) is a Python image: nvcc, CMake, ninja and PyTorch,
# but whether it has Boost, spdlog, CLI11, Catch2, zlib's header or OpenBLAS no session has seen.
# run_owed.sh unpacks the archive into .deps/sys and gives CMake its prefixes as fallbacks
# (PLEXUS_FALLBACK_PREFIXES): a library the machine has is still found first.
#
# Only Boost's headers that Plexus includes, and what they include, are packed (about 300 files,
# not Boost's 15,000). The archive is about 6 MB, the whole of .deps 37 MB; the carry may be
# 64 MiB with the tree.
#
#   bash tests/gpu/stage_deps.sh          (from the checkout's root)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
grep -qx '/.deps/' .git/info/exclude 2> /dev/null || echo /.deps/ >> .git/info/exclude
mkdir -p .deps/include
# (.deps/sys is where run_owed.sh unpacks the archive on the GPU machine: never carried.)
rm -rf .deps/sys
rm -rf .deps/include/toml++ && cp -r /usr/include/toml++ .deps/include/
if [[ -d ../shared/bench ]]; then rm -rf .deps/bench && cp -r ../shared/bench .deps/bench; fi
rm -rf .deps/fashion-mnist && cp -r /usr/share/datasets/fashion-mnist .deps/fashion-mnist

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Copies the files of Debian packages ($2...) into prefix $1 of the archive, keeping their paths
# below /usr (so their CMake package files, which find their prefix relative to themselves, work
# there), without docs, pkg-config files or static libraries (but the one Catch2's package names). /lib is /usr/lib (merged /usr).
pack_packages() {
  local prefix=$stage/$1
  shift
  dpkg -L "$@" | sed 's|^/lib/|/usr/lib/|' | sort -u | while read -r f; do
    case $f in
      /usr/*) ;;
      *) continue ;;
    esac
    case $f in
      */libCatch2WithMain.a) ;;  # Catch2's CMake package requires it (Plexus has its own main)
      /usr/share/doc/* | /usr/share/lintian/* | /usr/share/man/* | */pkgconfig/* | *.a) continue ;;
      /usr/share/Catch2/* | */liblapack.so* | */libblas.so*) continue ;;
    esac
    [[ -f $f || -L $f ]] || continue
    mkdir -p "$prefix/$(dirname "${f#/usr/}")"
    cp -P "$f" "$prefix/${f#/usr/}"
  done
  # A link to an absolute path (zlib's libz.so -> /lib/...) points at its file beside it.
  find "$prefix" -type l -lname '/*' | while read -r l; do
    ln -sfn "$(basename "$(readlink "$l")")" "$l"
  done
}

# Boost: the headers Plexus includes (core/src/plugin.cpp; with and without std::filesystem) and
# their closure, as the compiler sees it, and Boost's CMake package (find_package(Boost CONFIG)).
boost_includes=$(grep -rhoE --include='*.[ch]pp' --include='*.h' --include='*.cu' --include='*.cuh' \
                 '#include <boost/[^>]+>' core apps plugins sdk tests | sort -u)
printf '%s\nint main() {}\n' "$boost_includes" > "$stage/boost.cpp"
for def in -DBOOST_DLL_USE_STD_FS ""; do
  g++ -std=c++20 $def -M "$stage/boost.cpp"
done | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u | while read -r f; do
  mkdir -p "$stage/boost/$(dirname "${f#/usr/}")"
  cp "$f" "$stage/boost/${f#/usr/}"
done
boost_cmake=$(dpkg -L libboost1.74-dev | grep -E '/cmake/(Boost-|boost_headers-|BoostDetectToolset-)' |
              grep -v '/$' || true)
for f in $boost_cmake; do
  [[ -f $f ]] || continue
  mkdir -p "$stage/boost/$(dirname "${f#/usr/}")"
  cp "$f" "$stage/boost/${f#/usr/}"
done

pack_packages spdlog libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
pack_packages cli11 libcli11-dev
pack_packages catch2 catch2
pack_packages zlib zlib1g-dev zlib1g
pack_packages openblas libopenblas-openmp-dev libopenblas0-openmp
# OpenBLAS's Fortran runtime, beside it (the CPU plugin's run path, cmake/PlexusDependencies).
ob=$stage/openblas/lib/x86_64-linux-gnu/openblas-openmp
for f in libgfortran.so.5 libquadmath.so.0; do
  cp -L /usr/lib/x86_64-linux-gnu/$f "$ob/$f"
done

# What each prefix came from, for the summary on the GPU machine.
for p in "$stage"/*/; do
  echo "$(basename "$p"): $(find "$p" -type f | wc -l) files"
done > "$stage/CONTENTS"
dpkg-query -W libboost1.74-dev libspdlog-dev libfmt-dev libcli11-dev catch2 zlib1g-dev \
  libopenblas-openmp-dev libgfortran5 >> "$stage/CONTENTS"
rm -f "$stage/boost.cpp"
tar -C "$stage" -cJf .deps/sysdeps.tar.xz .
cat "$stage/CONTENTS"
du -sh .deps/sysdeps.tar.xz .deps
