#!/usr/bin/env bash
# The SDK as a third party sees it (ctest runs it; see tests/CMakeLists.txt):
#   install_example.sh BUILD_DIR SOURCE_DIR WORK_DIR
# installs this build into a fresh prefix, builds sdk/examples/backend out of tree against the
# installed package only (find_package(Plexus)), and loads the example through the installed
# `plexus info`: the installed CPU plugin is found in the prefix, the example through
# PLEXUS_PLUGIN_PATH, with its four kernels, and it links no part of Plexus; sdk/examples/comm
# built the same way carries plexus bench comm with correct results; sdk/examples/custom_op
# built the same way adds example.swish with kernels for the installed cpu backend (kernel
# extensions), which the installed plexus lists and trains swish_mlp.toml with, its loss finite
# and falling; plexus compare runs the example backend against the cpu over the built-in suite,
# and the custom op's own suite, a step and a short training; and a program that links the
# installed core library (Plexus::core) trains a step.
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
echo "== plexus compare: the example backend against the cpu over the built-in suite"
# Its four f32 ops must pass; every other row is listed unsupported on it, and the exit code is 0.
PLEXUS_PLUGIN_PATH="$work/example" "$prefix/bin/plexus" compare --b naive --only ops --repeats 1 \
  --warmup 0 --json "$work/compare-naive.json" > "$work/compare-naive.txt" 2>&1 ||
  { grep -vE " pass | unsupported on b " "$work/compare-naive.txt" | tail -40; exit 1; }
tail -n 5 "$work/compare-naive.txt"
for op in relu add mul linear; do
  tr -d '\n' < "$work/compare-naive.json" |
    grep -qE "\"item\":\"$op\",\"pass\":\"forward\",\"dtype\":\"f32\",\"what\":\"[^\"]*\",\"ops\":\"[^\"]*\",\"status\":\"pass\"" ||
    { echo "plexus compare has no passing f32 forward row of $op on naive"; exit 1; }
done
grep -q "unsupported on b" "$work/compare-naive.txt" || { echo "no row is listed unsupported on naive"; exit 1; }

echo "== the example communicator, out of tree, through plexus bench comm"
cmake -S "$src/sdk/examples/comm" -B "$work/comm" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/comm-configure.log"
cmake --build "$work/comm" > "$work/comm-build.log" || { cat "$work/comm-build.log"; exit 1; }
PLEXUS_PLUGIN_PATH="$work/comm" "$prefix/bin/plexus" bench comm --comm solo --bootstrap solo \
  --max-bytes 64K --iters 3 > "$work/bench.txt" 2>&1 || { cat "$work/bench.txt"; exit 1; }
tail -n 4 "$work/bench.txt"
grep -q "results checked: all correct" "$work/bench.txt" ||
  { echo "plexus bench comm over the example communicator did not check out"; cat "$work/bench.txt"; exit 1; }

echo "== the example op plugin, out of tree: plexus info and plexus train"
cmake -S "$src/sdk/examples/custom_op" -B "$work/custom_op" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/op-configure.log"
cmake --build "$work/custom_op" > "$work/op-build.log" || { cat "$work/op-build.log"; exit 1; }
oplib=$work/custom_op/libplexus-example.so
[ -f "$oplib" ] || { echo "no $oplib"; exit 1; }
if ldd "$oplib" | grep -q plexus; then echo "the op example links a Plexus library:"; ldd "$oplib"; exit 1; fi
PLEXUS_PLUGIN_PATH="$work/custom_op" "$prefix/bin/plexus" info > "$work/op-info.txt" 2>&1
sed -n '/^Kernel extensions/,/^$/p' "$work/op-info.txt"
for line in "example.swish f32 on cpu: example-swish-loop (plugin example)" \
            "example.swish_backward f32 on cpu: example-swish-backward-loop (plugin example)"; do
  grep -qF "$line" "$work/op-info.txt" ||
    { echo "plexus info lacks: $line"; cat "$work/op-info.txt"; exit 1; }
done
grep -qE "^ +example\.swish +f32 f64  \(kernel from plugin example\)" "$work/op-info.txt" ||
  { echo "plexus info does not list example.swish among the cpu's ops"; exit 1; }
# Three short epochs of swish_mlp.toml on the synthetic set (train.toml), on the installed cpu.
PLEXUS_PLUGIN_PATH="$work/custom_op" "$prefix/bin/plexus" train \
  "$src/sdk/examples/custom_op/train.toml" --set train.epochs=3 --set train.eval=false \
  --set output.dir="$work/op-run" --set logging.progress=none > "$work/op-train.txt" 2>&1 ||
  { cat "$work/op-train.txt"; exit 1; }
tail -n 2 "$work/op-train.txt"
# Each epoch's mean training loss, from the run's metrics: finite, and lower each epoch.
losses=$(grep '"type":"epoch"' "$work/op-run/metrics.jsonl" |
         sed -E 's/.*"train_loss":([^,}]*).*/\1/')
echo "epoch losses:" $losses
awk -v l="$losses" 'BEGIN {
  n = split(l, v, " ")
  if (n != 3) { print "expected 3 epochs, got " n; exit 1 }
  for (i = 1; i <= n; ++i) if (v[i] !~ /^[0-9.eE+-]+$/) { print "loss " i " is not finite: " v[i]; exit 1 }
  for (i = 2; i <= n; ++i) if (v[i] + 0 >= v[i - 1] + 0) { print "the loss did not fall: " l; exit 1 }
}' || exit 1
# plexus compare with the plugin's op: its suite (forward and backward rows in f32 and f64), a
# step of swish_mlp.toml and 10 training steps, the cpu with itself.
PLEXUS_PLUGIN_PATH="$work/custom_op" "$prefix/bin/plexus" compare "$src/sdk/examples/custom_op/train.toml" \
  --b cpu --suite "$src/sdk/examples/custom_op/compare.toml" --steps 10 --repeats 2 \
  > "$work/op-compare.txt" 2>&1 || { cat "$work/op-compare.txt"; exit 1; }
tail -n 4 "$work/op-compare.txt"
grep -qE "^ops +example\.swish +backward f64 " "$work/op-compare.txt" ||
  { echo "plexus compare has no backward row for example.swish"; exit 1; }
grep -qE "^step +grad swish\.beta " "$work/op-compare.txt" ||
  { echo "plexus compare's step does not compare the gradient of swish.beta"; exit 1; }

echo "== a program embedding the installed runtime (Plexus::core)"
cmake -S "$src/tests/sdk/embed" -B "$work/embed" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/embed-configure.log"
cmake --build "$work/embed" > "$work/embed-build.log" || { cat "$work/embed-build.log"; exit 1; }
PLEXUS_PLUGIN_PATH="$prefix/lib/plexus/plugins" "$work/embed/embed" | tee "$work/embed.txt"
grep -q "embedded runtime trained" "$work/embed.txt" || { echo "the embedded runtime failed"; exit 1; }
echo "the installed SDK built and ran the examples"
