#!/usr/bin/env bash
# The SDK as a third party sees it (ctest runs it; see tests/CMakeLists.txt):
#   install_example.sh BUILD_DIR SOURCE_DIR WORK_DIR
# installs this build into a fresh prefix, builds sdk/examples/backend out of tree against the
# installed package only (find_package(Plexus)), and loads the example through the installed
# `plexus info`: the installed CPU plugin is found in the prefix, the example through
# PLEXUS_PLUGIN_PATH, with its four kernels, and it links no part of Plexus; sdk/examples/comm
# built the same way carries plexus bench comm with correct results; and a program that
# links the installed core library (Plexus::core) trains a step.
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
echo "== cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in bin/plexus include/plexus/sdk.hpp include/plexus/sdk/host_backend.hpp \
         lib/cmake/Plexus/PlexusConfig.cmake lib/cmake/Plexus/PlexusConfigVersion.cmake \
         lib/plexus/plugins/libplexus-cpu.so; do
  [ -e "$prefix/$f" ] || { echo "the install lacks $f"; exit 1; }
done
echo "== the example backend, out of tree"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$src/sdk/examples/backend" -B "$work/example" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log"
cmake --build "$work/example" > "$work/build.log"
lib=$work/example/libplexus-naive.so
[ -f "$lib" ] || { echo "no $lib"; cat "$work/build.log"; exit 1; }
if ldd "$lib" | grep -q plexus; then echo "the example links a Plexus library:"; ldd "$lib"; exit 1; fi
echo "== plexus info"
PLEXUS_PLUGIN_PATH="$work/example" "$prefix/bin/plexus" info > "$work/info.txt" 2>&1
cat "$work/info.txt" | head -n 40
grep -q "naive" "$work/info.txt" || { echo "plexus info does not list the naive backend"; exit 1; }
PLEXUS_PLUGIN_PATH="$work/example" "$prefix/bin/plexus" info --json > "$work/info.json"
for op in relu add mul linear; do
  tr -d ' \n' < "$work/info.json" | grep -q "\"name\":\"naive\"" ||
    { echo "no naive backend in plexus info --json"; exit 1; }
  tr -d ' \n' < "$work/info.json" | grep -q "\"$op\":\[\"f32\"\]" ||
    { echo "plexus info --json lacks op $op in f32"; exit 1; }
done
echo "== the example communicator, out of tree, through plexus bench comm"
cmake -S "$src/sdk/examples/comm" -B "$work/comm" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/comm-configure.log"
cmake --build "$work/comm" > "$work/comm-build.log" || { cat "$work/comm-build.log"; exit 1; }
PLEXUS_PLUGIN_PATH="$work/comm" "$prefix/bin/plexus" bench comm --comm solo --bootstrap solo \
  --max-bytes 64K --iters 3 > "$work/bench.txt" 2>&1 || { cat "$work/bench.txt"; exit 1; }
tail -n 4 "$work/bench.txt"
grep -q "results checked: all correct" "$work/bench.txt" ||
  { echo "plexus bench comm over the example communicator did not check out"; cat "$work/bench.txt"; exit 1; }

echo "== a program embedding the installed runtime (Plexus::core)"
cmake -S "$src/tests/sdk/embed" -B "$work/embed" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/embed-configure.log"
cmake --build "$work/embed" > "$work/embed-build.log" || { cat "$work/embed-build.log"; exit 1; }
PLEXUS_PLUGIN_PATH="$prefix/lib/plexus/plugins" "$work/embed/embed" | tee "$work/embed.txt"
grep -q "embedded runtime trained" "$work/embed.txt" || { echo "the embedded runtime failed"; exit 1; }
echo "the installed SDK built and loaded the example backend"
