#!/usr/bin/env bash
# The tuner and the CUDA plugin's fused kernels on the emulated plugin (ctest runs it; see
# emu.cmake):
#   group_tuning_on_emulator.sh PLEXUS EMU_PLUGIN_DIR WORKDIR
# simplecnn's whole step is one fused kernel (small_cnn_step) that does all 20 of its nodes with
# its own code and says so (PLX_KERNEL_SELF_CONTAINED, ABI 1.6). With a fresh tune cache and
# backend.kernels = "auto" the run must succeed (the forty-seventh session found it failing when
# timing noise picked one of the gradient matmuls' alternatives), the tuner must time neither its
# nodes' kernels nor the step around them (nothing for them in the cache), and the manifest must
# not say that its nodes ran on kernels of their own (the step ran them). A second run takes the
# same from the cache. The parts' groups (step_fusion = false), whose kernels run each member on
# the kernel the host chose, are still tuned as a whole.
set -euo pipefail
plexus=$1 emu=$2 work=$3
rm -rf "$work"
mkdir -p "$work/cache"
export PLEXUS_CACHE_DIR=$work/cache
args=(--set backend.name=\"cuda\" --set "plugins.paths=[\"$emu\"]" --set backend.kernels=\"auto\"
      --set train.max_steps=2 --set train.eval=false --set data.limit=256
      --set logging.progress=\"none\" --set plugins.options.cuda.benchmark=false
      --set 'backend.exclude_kernels=["igemm_*","mma_sync_*","cudnn_graph"]')  # slow to time here
cache=$work/cache/kernels.tsv
check() {  # manifest, then "step" or "parts"
  python3 - "$1" "$2" "$cache" << 'EOF'
import json, os, sys
manifest, mode, cache = sys.argv[1:]
m = json.load(open(manifest))
kernels = m["kernels"]
nodes = m["kernel_choice"]["nodes"]
lines = [l for l in (open(cache).read().splitlines() if os.path.exists(cache) else []) if l and not l.startswith("#")]
decisions = [l.split("\t")[0].split(" & ")[0] for l in lines if l.startswith("fused|")]
# A node's key: backend|device|plugin and options|op|shapes...
tuned_ops = sorted({l.split("\t")[0].split("|")[3] for l in lines if not l.startswith("fused|")})
print(mode, "kernels:", *kernels, sep="\n  ")
print(mode, "nodes with a choice:", [(n["node"], n["op"], n["kernel"]) for n in nodes])
print(mode, "group decisions:", decisions, "ops tuned:", tuned_ops)
step = [k for k in kernels if "cuda/small_cnn_step" in k]
if mode == "step":
    if len(step) != 1:
        sys.exit("expected one small_cnn_step kernel, got %d" % len(step))
    if "; " in step[0].split("cuda/small_cnn_step", 1)[1]:
        sys.exit("small_cnn_step lists member kernels that never run: " + step[0])
    members = [n for n in nodes if n["node"] in ("linear_1.grad", "conv2d_1", "conv2d_2")]
    if members:
        sys.exit("the manifest gives the step's nodes kernels of their own: %s" % members)
    if "fused|small_cnn_step" in decisions:
        sys.exit("the tuner timed small_cnn_step as a whole around its members' kernels")
    step_ops = {"conv2d", "linear", "matmul", "conv2d_backward_data", "conv2d_backward_weight"}
    if step_ops & set(tuned_ops):
        sys.exit("the tuner timed the step's nodes' kernels, which never run: %s"
                 % sorted(step_ops & set(tuned_ops)))
else:
    if step:
        sys.exit("small_cnn_step ran with step_fusion = false")
    if not any(d.startswith("fused|conv2d+relu+max_pool2d") for d in decisions):
        sys.exit("the conv + relu + pool groups were not tuned as a whole")
print(mode, "ok")
EOF
}
echo "== the whole step, a fresh cache"
"$plexus" train configs/simplecnn.toml "${args[@]}" --set output.dir=\"$work/fresh\"
check "$work/fresh/manifest.json" step
echo "== the whole step, the cache of the first run"
"$plexus" train configs/simplecnn.toml "${args[@]}" --set output.dir=\"$work/cached\"
check "$work/cached/manifest.json" step
echo "== the parts' groups"
"$plexus" train configs/simplecnn.toml "${args[@]}" --set plugins.options.cuda.step_fusion=false \
  --set output.dir=\"$work/parts\"
check "$work/parts/manifest.json" parts
echo "a self-contained fused kernel is made once and its members' kernels are not reported"
