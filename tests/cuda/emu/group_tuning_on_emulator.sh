#!/usr/bin/env bash
# The tuner's whole-group timing on the emulated CUDA plugin (ctest runs it; see emu.cmake):
#   group_tuning_on_emulator.sh PLEXUS EMU_PLUGIN_DIR WORKDIR
# simplecnn's whole step is one fused kernel (small_cnn_step) whose members include the linear's
# two gradient matmuls, both named "linear_1.grad" and each with two candidates. With a fresh
# tune cache and backend.kernels = "auto" the tuner times the group around each member's other
# candidates and writes the run's manifest (each alternative must have a name of its own there:
# the two matmuls' once shared one, and the manifest's JSON refused the second). Then the cache's
# decision for the group is set to the second matmul's alternative, "linear_1.grad#2:matmul=
# simt_16x16", and the next run must put that member, and not the first, on it.
set -euo pipefail
plexus=$1 emu=$2 work=$3
rm -rf "$work"
mkdir -p "$work/cache"
export PLEXUS_CACHE_DIR=$work/cache
args=(--set backend.name=\"cuda\" --set "plugins.paths=[\"$emu\"]" --set backend.kernels=\"auto\"
      --set train.max_steps=2 --set train.eval=false --set data.limit=256
      --set logging.progress=\"none\" --set plugins.options.cuda.benchmark=false
      --set 'backend.exclude_kernels=["igemm_*","mma_sync_*","cudnn_graph"]')  # slow to time here
echo "== tuned with a fresh cache"
"$plexus" train configs/simplecnn.toml "${args[@]}" --set output.dir=\"$work/tuned\"
cache=$work/cache/kernels.tsv
grep -q '^fused|small_cnn_step' "$cache" || { echo "no decision for small_cnn_step in $cache"; exit 1; }
echo "== the group's decision set to the second gradient matmul's alternative"
awk -F'\t' 'BEGIN { OFS = "\t" } /^fused\|small_cnn_step/ { $2 = "linear_1.grad#2:matmul=simt_16x16" } { print }' \
  "$cache" > "$cache.new"
mv "$cache.new" "$cache"
"$plexus" train configs/simplecnn.toml "${args[@]}" --set output.dir=\"$work/cached\"
python3 - "$work/tuned/manifest.json" "$work/cached/manifest.json" << 'EOF'
import json, sys
def grads(path):
    nodes = json.load(open(path))["kernel_choice"]["nodes"]
    g = [n for n in nodes if n["node"] == "linear_1.grad" and n["op"] == "matmul"]
    print(path, "linear_1.grad's matmuls:", [(n["kernel"], n["how"]) for n in g])
    if len(g) != 2:
        sys.exit("expected the two gradient matmuls of linear_1, got %d" % len(g))
    return g
tuned, cached = grads(sys.argv[1]), grads(sys.argv[2])
if cached[1]["kernel"] != "simt_16x16":
    sys.exit("the second matmul is on %s, not the cached simt_16x16" % cached[1]["kernel"])
if cached[0]["kernel"] != tuned[0]["kernel"]:
    sys.exit("the first matmul moved from %s to %s: it took the second's alternative"
             % (tuned[0]["kernel"], cached[0]["kernel"]))
print("each member's alternative has a name of its own")
EOF
