#!/usr/bin/env bash
# The trainer on the emulated CUDA plugin against the CPU (ctest runs it; see emu.cmake):
#   train_on_emulator.sh PLEXUS COMPARE EMU_PLUGIN_DIR WORKDIR
# trains SimpleCNN for 6 steps on the CPU and on the emulated CUDA plugin (resident data gathered
# on the device, the step captured and replayed with the pipeline's copies, the whole-step kernel
# and, with step_fusion off, its parts' fused kernels, a checkpoint read back from the device) and holds their losses and final checkpoints to each
# other, and the same run uncaptured and with batches from the host to it exactly; one epoch
# evaluated on the test set (captured and not, against the CPU's evaluation); then the same in bf16
# and in f16 with loss scaling on the emulator alone, which must train (finite, falling losses)
# and, for f16, start at a loss scale of 65536. On the emulator every kernel of the plugin is
# launched to overlap the one before it (programmatic dependent launch), which the trace shows;
# launched the ordinary way (the option off, or kernels compiled for sm_80) none is, with the
# same bits. Those runs force a side, so that the tuner does not time every candidate on the CPU
# (minutes for nothing): the whole-step runs the native side (the library side declines the
# plugin's own step), the others the library side (the emulator's stand-ins for cuBLASLt and
# cuDNN). A last run takes the native side in bf16, the plugin's own Tensor Core kernels
# (mma.sync GEMMs, implicit-GEMM convolutions) on the emulator's PTX, held to the CPU as well.
set -euo pipefail
plexus=$1 compare=$2 emu=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
common=(--set train.max_steps=6 --set train.eval=false --set data.limit=768
        --set logging.progress=\"plain\" --set train.seed=3)
emu_args=(--set backend.name=\"cuda\" --set "plugins.paths=[\"$emu\"]"
          --set backend.kernels=\"library\")
# The whole-step kernel (small_cnn_step) is the plugin's own code, which the library side
# declines for nodes a library kernel takes: its runs take the native side (the step's nodes
# need no kernel of their own, so nothing is timed or emulated beyond the library side's).
step_args=("${emu_args[@]}" --set backend.kernels=\"native\")
echo "== cpu, f32"
"$plexus" train configs/simplecnn.toml --set backend.name=\"cpu\" "${common[@]}" \
  --set output.dir=\"$work/cpu\"
echo "== emulated cuda, f32"
PLEXUS_EMU_TRACE="$work/cuda.trace" "$plexus" train configs/simplecnn.toml "${step_args[@]}" "${common[@]}" \
  --set plugins.options.cuda.tf32=false --set output.dir=\"$work/cuda\" 2>&1 | tee "$work/cuda.log"
grep -q "on cuda:0" "$work/cuda.log" || { echo "the run was not on cuda:0"; exit 1; }
grep -q "cuda/small_cnn_step" "$work/cuda/manifest.json" || { echo "the step did not run as small_cnn_step"; exit 1; }
echo "== compare"
# Sums in another order (the CPU's Winograd convolutions against the emulator's direct loops).
"$compare" "$work/cpu" "$work/cuda" --rtol 1e-3 --atol 1e-5
# The step above runs as the whole-step kernel (small_cnn_step, ops/step_cnn.cu); with the
# option step_fusion off its parts' own fused kernels run it (the library side, the emulator's
# stand-ins for cuDNN and cuBLASLt inside them), held to the CPU and to it.
echo "== emulated cuda, f32, step_fusion=false"
"$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" \
  --set plugins.options.cuda.tf32=false --set plugins.options.cuda.step_fusion=false \
  --set output.dir=\"$work/cuda-parts\"
echo "== compare"
"$compare" "$work/cpu" "$work/cuda-parts" --rtol 1e-3 --atol 1e-5
"$compare" "$work/cuda" "$work/cuda-parts" --rtol 1e-3 --atol 1e-5
# The conv's bias added in the pool kernel (pool_bias, on by default) against the bias added by
# the convolution: in f32 the same bits, losses and checkpoints alike.
echo "== emulated cuda, f32, step_fusion=false, the bias in the convolution"
"$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" \
  --set plugins.options.cuda.tf32=false --set plugins.options.cuda.pool_bias=false \
  --set plugins.options.cuda.step_fusion=false --set output.dir=\"$work/cuda-conv-bias\"
echo "== compare, exactly"
"$compare" "$work/cuda-parts" "$work/cuda-conv-bias" --rtol 0 --atol 0
# Programmatic dependent launch: on the emulated compute capability 9.0 every kernel of the
# plugin is launched to overlap the kernel before it (and the emulator fails any launch whose
# threads touch device memory or exit before they wait); with the option off, or as an sm_80
# build would run (PTX version 80: kernels without the wait), none is, and the bits are the same.
programmatic() {  # TRACE all|none: the plugin's kernel launches (library calls aside)
  python3 - "$1" "$2" <<'PY'
import sys
lines = [l.rstrip("\n") for l in open(sys.argv[1]) if not l.rstrip().endswith("(library)")]
on = [l for l in lines if l.endswith(" programmatic")]
assert len(lines) >= 8, f"{len(lines)} kernel launches traced"  # 2 steps of 4 at the least
want = len(lines) if sys.argv[2] == "all" else 0
assert len(on) == want, f"{len(on)} of {len(lines)} launches programmatic, {sys.argv[2]} expected: " + \
    next((l for l in lines if (l in on) != (want > 0)), "")
print(f"{len(on)} of {len(lines)} kernel launches programmatic")
PY
}
echo "== the plugin's kernels, launched programmatically"
programmatic "$work/cuda.trace" all
echo "== emulated cuda, f32, programmatic_launch=false"
PLEXUS_EMU_TRACE="$work/cuda-ordinary.trace" "$plexus" train configs/simplecnn.toml "${step_args[@]}" \
  "${common[@]}" --set plugins.options.cuda.tf32=false \
  --set plugins.options.cuda.programmatic_launch=false --set output.dir=\"$work/cuda-ordinary\"
programmatic "$work/cuda-ordinary.trace" none
echo "== compare, exactly"
"$compare" "$work/cuda" "$work/cuda-ordinary" --rtol 0 --atol 0
echo "== emulated cuda, f32, kernels compiled for compute capability 8.0"
PLEXUS_EMU_PTX_VERSION=80 PLEXUS_EMU_TRACE="$work/cuda-sm80.trace" "$plexus" train configs/simplecnn.toml \
  "${step_args[@]}" "${common[@]}" --set train.max_steps=2 --set plugins.options.cuda.tf32=false \
  --set output.dir=\"$work/cuda-sm80\"
programmatic "$work/cuda-sm80.trace" none
# The pipeline's copies and gather are captured with the step, one graph per slot: the same run
# with the step uncaptured (every copy on its own) and with the batches from the host instead of
# gathered on the device must give the same bits.
for variant in "graph_capture:train.graph_capture=false" "host_batches:data.resident=\"off\""; do
  echo "== emulated cuda, f32, ${variant#*:}"
  "$plexus" train configs/simplecnn.toml "${step_args[@]}" "${common[@]}" \
    --set plugins.options.cuda.tf32=false --set "${variant#*:}" \
    --set output.dir=\"$work/cuda-${variant%%:*}\"
  echo "== compare, exactly"
  "$compare" "$work/cuda" "$work/cuda-${variant%%:*}" --rtol 0 --atol 0
done
# Evaluation on the test set runs through a pipeline of its own (resident test images, its
# graph captured with the slot's copies): captured and not, the same bits; against the CPU's
# evaluation after the same training, the same accuracy within a few images.
for where in cpu cuda-captured cuda-uncaptured; do
  echo "== $where, f32, evaluated"
  case $where in
    cpu) args=(--set backend.name=\"cpu\") ;;
    cuda-captured) args=("${emu_args[@]}" --set plugins.options.cuda.tf32=false) ;;
    cuda-uncaptured) args=("${emu_args[@]}" --set plugins.options.cuda.tf32=false --set train.graph_capture=false) ;;
  esac
  "$plexus" train configs/simplecnn.toml "${args[@]}" "${common[@]}" --set train.eval=true --set train.max_steps=0 --set train.epochs=1 \
    --set output.dir=\"$work/eval-$where\"
done
python3 - "$work"/eval-{cpu,cuda-captured,cuda-uncaptured}/metrics.jsonl <<'PY'
import json, sys
def evals(f):
    return [(s["test_loss"], s["test_accuracy"]) for s in map(json.loads, filter(str.strip, open(f)))
            if s.get("type") == "epoch" and "test_accuracy" in s]
cpu, cap, uncap = map(evals, sys.argv[1:])
assert cap and len(cap) == len(cpu) == len(uncap), (cpu, cap, uncap)
assert cap == uncap, f"captured {cap} against uncaptured {uncap}"
for (lc, ac), (lg, ag) in zip(cpu, cap):
    assert abs(ac - ag) <= 0.002 and abs(lc - lg) <= 1e-3 * abs(lc), f"cpu {cpu} against cuda {cap}"
print("evaluation alike: cpu", cpu, "cuda", cap)
PY
for p in bf16 f16; do
  echo "== emulated cuda, $p"
  "$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" \
    --set train.precision=\"$p\" --set output.dir=\"$work/cuda-$p\"
  python3 - "$work/cuda-$p/metrics.jsonl" "$p" <<'PY'
import json, math, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [s for s in steps if s.get("type") == "step"]
losses = [s["loss"] for s in steps]
assert len(losses) == 6, f"{len(losses)} steps, 6 expected"
assert all(math.isfinite(x) for x in losses), f"non-finite loss: {losses}"
assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
if sys.argv[2] == "f16":
    assert steps[0]["loss_scale"] == 65536, steps[0]
    assert not any(s["skipped"] for s in steps), "f16 skipped steps"
print(sys.argv[2], "losses", " ".join(f"{x:.4f}" for x in losses))
PY
done
# f16's loss scale report comes back with the loss, inside the captured graph: uncaptured, the
# same bits and the same scale.
echo "== emulated cuda, f16, train.graph_capture=false"
"$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" \
  --set train.precision=\"f16\" --set train.graph_capture=false --set output.dir=\"$work/cuda-f16-uncaptured\"
echo "== compare, exactly"
"$compare" "$work/cuda-f16" "$work/cuda-f16-uncaptured" --rtol 0 --atol 0
python3 - "$work/cuda-f16/metrics.jsonl" "$work/cuda-f16-uncaptured/metrics.jsonl" <<'PY'
import json, sys
scales = [[(s["loss_scale"], s["skipped"]) for s in map(json.loads, filter(str.strip, open(f)))
           if s.get("type") == "step"] for f in sys.argv[1:]]
assert scales[0] == scales[1] and len(scales[0]) == 6, scales
print("f16 loss scales alike, captured and not:", scales[0][0])
PY
# Mixed precision with AdamW against the cpu: the fused step reads the bf16 gradients in the
# multi-tensor update and casts dlogits back in the head. Held loosely (a sum in another order
# may round a bf16 value the other way), which still catches an update misreading gradients.
bf16=(--set train.precision=\"bf16\" --set train.optimizer=\"adamw\" --set train.lr=0.001)
echo "== cpu, bf16 adamw"
"$plexus" train configs/simplecnn.toml --set backend.name=\"cpu\" "${common[@]}" "${bf16[@]}" \
  --set output.dir=\"$work/cpu-bf16\"
echo "== emulated cuda, bf16 adamw"
"$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" "${bf16[@]}" \
  --set output.dir=\"$work/cuda-bf16-adamw\"
echo "== compare"
"$compare" "$work/cpu-bf16" "$work/cuda-bf16-adamw" --rtol 2e-2 --atol 1e-3
echo "== emulated cuda, bf16 adamw, native kernels"
"$plexus" train configs/simplecnn.toml "${emu_args[@]}" "${common[@]}" "${bf16[@]}" \
  --set backend.kernels=\"native\" --set output.dir=\"$work/cuda-bf16-native\"
for k in mma_sync_ igemm_mma_; do
  grep -q "on $k" "$work/cuda-bf16-native/manifest.json" ||
    { echo "no op ran on a $k kernel (manifest.json's kernels)"; exit 1; }
done
echo "== compare"
"$compare" "$work/cpu-bf16" "$work/cuda-bf16-native" --rtol 2e-2 --atol 1e-3
echo "trains on the emulator as on the cpu"
