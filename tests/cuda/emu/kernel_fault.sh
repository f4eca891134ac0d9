#!/usr/bin/env bash
# A kernel that faults on the device (ctest runs it; see emu.cmake):
#   kernel_fault.sh PLEXUS EMU_PLUGIN_DIR WORKDIR
# On a GPU a kernel's fault (an illegal address, a trap) leaves the context unusable: every later
# call fails, so the process cannot go on, and a kernel that never ran on hardware before may
# fault there (docs/gpu-owed.md). The emulator's faults are sticky too, and
# PLEXUS_EMU_FAULT_KERNEL makes every launch of the kernels it names fault. Then:
# 1. a kernel that is not timed faulting (simplecnn's whole-step kernel, made once): plexus train
#    fails, and the error says a kernel failed and that backend.check_kernels names it;
# 2. with backend.check_kernels = true the run exits with status 3 naming the kernel and how to
#    keep it out;
# 3. a candidate the tuner times faulting (the parts' classifier GEMM on the SIMT kernel): status
#    3, the candidate named;
# 4. run_owed.sh's run_unstuck (tests/gpu/run_lib.sh) gets through both faults at once: a rerun
#    with check_kernels names the first kernel, each kernel is kept out in turn, and the run
#    trains its steps; summary.txt says so;
# 5. and through a step that hangs (plexus's stuck-step message, from a stand-in);
# 6. and through a fault that waiting for each kernel hides (a stand-in): the command runs again
#    as it was, with programmatic launches off.
set -euo pipefail
plexus=$1 emu=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
source tests/cuda/emu/emu_run.sh  # fail, steps
args=(configs/simplecnn.toml --set backend.name=\"cuda\" --set "plugins.paths=[\"$emu\"]"
      --set train.max_steps=2 --set train.batch_size=32 --set data.limit=256
      --set train.eval=false --set logging.progress=\"plain\" --set backend.tune_cache=\"off\"
      --set plugins.options.cuda.benchmark=false)
step_kernel='step_cnn_images*'
candidate_kernel='simt_gemm_kernel*' candidate=simt_16x16
# The parts' runs leave the implicit-GEMM candidates out: timing them on the emulator is most of
# a minute, and the test needs only one candidate besides the faulting one.
parts=(--set plugins.options.cuda.step_fusion=false --set 'backend.exclude_kernels=["igemm_*"]')
# (run_unstuck's run below starts with the whole-step kernel: "${parts[@]:2}", the exclusion.)
# plexus train with the kernels matching FAULT faulting, into WORK/NAME (its log NAME.log), must
# exit with status WANT.
faulting_run() {  # NAME FAULT WANT ARGS...
  local name=$1 faulty=$2 want=$3 st=0
  shift 3
  PLEXUS_EMU_FAULT_KERNEL=$faulty "$plexus" train "${args[@]}" "$@" \
    --set output.dir=\""$work/$name"\" > "$work/$name.log" 2>&1 || st=$?
  cat "$work/$name.log"
  ((st == want)) || fail "plexus train ($name) exited $st, not $want"
}

# 1. A fault outside the tuner: the error says what happened and what names the kernel.
faulting_run step "$step_kernel" 1
grep -q "plexus: error: .*CUDA error cudaErrorIllegalAddress: .*; a kernel failed on the device, which is unusable for the rest of this process (backend.check_kernels = true names the kernel)" "$work/step.log" ||
  fail "the error does not say that a kernel faulted and how to find it"

# 2. backend.check_kernels names it.
faulting_run check "$step_kernel" 3 --set backend.check_kernels=true
grep -q "plexus: error: fused kernel 'small_cnn_step'.*: kernel small_cnn_step on 'cuda' failed on the device (.*cudaErrorIllegalAddress.*); keep it out with backend.exclude_kernels = \[\"small_cnn_step\"\] or PLEXUS_EXCLUDE_KERNELS=small_cnn_step" "$work/check.log" ||
  fail "backend.check_kernels did not name the whole-step kernel and how to keep it out"

# 3. A candidate that faults while the tuner times it.
faulting_run tuned "$candidate_kernel" 3 "${parts[@]}"
grep -q "\[critical\] op 'linear' on 'cuda': the tuner's run of candidate $candidate failed and left the device unusable (.*cudaErrorIllegalAddress.*; the stream after it: .*cudaErrorIllegalAddress.*), and the process exits; keep the kernel out with backend.exclude_kernels = \[\"$candidate\"\] or PLEXUS_EXCLUDE_KERNELS=$candidate" "$work/tuned.log" ||
  fail "the tuner did not name the faulting candidate"

# 4. run_owed.sh's reruns, both kernels faulting.
OUT=$work/out
mkdir -p "$OUT"
: > "$OUT/summary.txt"
START=$(date +%s)
LIMIT=600
source tests/gpu/run_lib.sh
unset PLEXUS_EXCLUDE_KERNELS
export PLEXUS_EMU_FAULT_KERNEL=$step_kernel,$candidate_kernel
st=0
run_unstuck "$work/retry.log" 300 "$plexus" train "${args[@]}" "${parts[@]:2}" \
  --set output.dir=\""$work/retry"\" || st=$?
cat "$OUT/summary.txt"
((st == 0)) || { cat "$work/retry.log"; fail "run_unstuck's run ended with status $st"; }
grep -q "FAULTED OR STUCK (.*CUDA error cudaErrorIllegalAddress: .*; a kernel failed on the device); running it again with backend.check_kernels" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the run faulted"
grep -q "STUCK OR FAULTED: small_cnn_step;" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the whole-step kernel is kept out"
grep -q "STUCK OR FAULTED: $candidate; PLEXUS_EXCLUDE_KERNELS=small_cnn_step,$candidate from here on" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the faulting candidate is kept out"
n=$(steps "$work/retry.log")
((n == 2)) || fail "the run trained $n steps, not 2"

# 5. A step that hangs. The emulator runs a kernel inside its launch, so no hang can be made
#    there: a stand-in says what plexus says (tests/core/test_tune.cpp holds plexus to it, on the
#    test plugin), and run_unstuck must rerun it with backend.check_kernels, then without the
#    kernel that one names.
fake=$work/fake-plexus
cat > "$fake" <<'SH'
#!/usr/bin/env bash
# FAKE_MODE=hang: the step hangs until hung_kernel is kept out. FAKE_MODE=overlap: a kernel
# faults unless the kernels are waited for one by one or launched without programmatic edges.
args=" $* "
if [[ $FAKE_MODE == hang ]]; then
  if [[ ,${PLEXUS_EXCLUDE_KERNELS:-}, == *,hung_kernel,* ]]; then echo "trained"; exit 0; fi
  if [[ $args == *" backend.check_kernels=true "* ]]; then
    echo "[critical] node 'c' (conv2d): kernel hung_kernel on 'cuda' has not completed in 30 s (backend.step_timeout_s), so the device is taken for stuck and the process exits; keep it out with backend.exclude_kernels = [\"hung_kernel\"] or PLEXUS_EXCLUDE_KERNELS=hung_kernel"
    exit 3
  fi
  echo "[critical] a training step on 'cuda' has not completed in 30 s (backend.step_timeout_s), so the device is taken for stuck and the process exits; a kernel may hang on the device (backend.check_kernels = true names the kernel)"
  exit 3
fi
if [[ $args == *" plugins.options.cuda.programmatic_launch=false "* ]]; then echo "trained"; exit 0; fi
if [[ $args == *" backend.check_kernels=true "* ]]; then echo "checked"; exit 0; fi
echo "plexus: error: backend 'cuda': CUDA error cudaErrorIllegalAddress: an illegal memory access was encountered in cudaStreamSynchronize(native(s)) (backend.cpp:364); a kernel failed on the device, which is unusable for the rest of this process (backend.check_kernels = true names the kernel)"
exit 1
SH
chmod +x "$fake"
unset PLEXUS_EXCLUDE_KERNELS PLEXUS_EMU_FAULT_KERNEL
: > "$OUT/summary.txt"
FAKE_MODE=hang run_unstuck "$work/hang.log" 60 "$fake" train ||
  fail "run_unstuck did not get past the hanging kernel"
cat "$OUT/summary.txt"
grep -q "FAULTED OR STUCK (.*a training step on 'cuda' has not completed in 30 s (backend.step_timeout_s), so the device is taken for stuck and the process exits; a kernel may hang on the device); running it again with backend.check_kernels" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the step hung"
grep -q "STUCK OR FAULTED: hung_kernel; PLEXUS_EXCLUDE_KERNELS=hung_kernel from here on" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the hanging kernel is kept out"
grep -q "^trained$" "$work/hang.log" || fail "the run without the hanging kernel did not run"

# 6. A fault that waiting for each kernel hides: the run with check_kernels passes, but its
#    figures are not the command's; run_unstuck runs the command again without programmatic
#    launches, and keeps them off.
unset PLEXUS_EXCLUDE_KERNELS
PDL_OFF=()
: > "$OUT/summary.txt"
FAKE_MODE=overlap run_unstuck "$work/overlap.log" 60 "$fake" train ||
  fail "run_unstuck did not get past a fault that check_kernels hides"
cat "$OUT/summary.txt"
grep -q "NO FAULT with backend.check_kernels (kernels overlapping?); running it as it was, with programmatic launches off from here on" "$OUT/summary.txt" ||
  fail "summary.txt does not say that check_kernels hid the fault"
grep -q "^trained$" "$work/overlap.log" || fail "the last run is not the command's own"
[[ " ${PDL_OFF[*]} " == *" plugins.options.cuda.programmatic_launch=false "* ]] ||
  fail "programmatic launches are not kept off"
echo "a faulting kernel is named and kept out"
