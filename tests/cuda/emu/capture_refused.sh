#!/usr/bin/env bash
# A driver that refuses the captured step's programmatic launches (ctest runs it; see emu.cmake):
#   capture_refused.sh PLEXUS EMU_PLUGIN_DIR WORKDIR
# The CUDA plugin launches its kernels with programmatic stream serialization from compute
# capability 9.0 (docs/cuda.md, "Launches"), so a captured step holds programmatic edges, which
# no GPU has instantiated for us yet (docs/gpu-owed.md). The emulator refuses them on request
# (PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS=1: cudaGraphInstantiate fails with
# cudaErrorNotSupported). Then:
# 1. `plexus train` fails with a non-zero exit and an error that names cudaGraphInstantiate and
#    the option that avoids it;
# 2. with plugins.options.cuda.programmatic_launch = false the same run trains its steps;
# 3. run_owed.sh's run_unstuck (tests/gpu/run_lib.sh) reruns the failed run with the option,
#    says so in summary.txt, and keeps it for the next run.
set -euo pipefail
plexus=$1 emu=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
export PLEXUS_EMU_REFUSE_PROGRAMMATIC_GRAPHS=1
args=(configs/simplecnn.toml --set backend.name=\"cuda\" --set "plugins.paths=[\"$emu\"]"
      --set train.max_steps=3 --set train.batch_size=32 --set data.limit=256
      --set train.eval=false --set logging.progress=\"plain\"
      --set plugins.options.cuda.benchmark=false)
source tests/cuda/emu/emu_run.sh  # fail, steps

# 1. The refusal is an error that says what to do.
st=0
"$plexus" train "${args[@]}" --set output.dir=\""$work/refused"\" > "$work/refused.log" 2>&1 || st=$?
cat "$work/refused.log"
((st != 0)) || fail "plexus train exited 0 although the driver refused the captured step"
grep -q "plexus: error: backend 'cuda': capture_end: .*cudaGraphInstantiate" "$work/refused.log" ||
  fail "the error does not name capture_end and cudaGraphInstantiate"
grep -q "plugins.options.cuda.programmatic_launch = false" "$work/refused.log" ||
  fail "the error does not name the option that launches the kernels without programmatic edges"

# 2. The option captures the step without programmatic launches.
"$plexus" train "${args[@]}" --set plugins.options.cuda.programmatic_launch=false \
  --set output.dir=\""$work/plain"\" > "$work/plain.log" 2>&1 ||
  { cat "$work/plain.log"; fail "plexus train with programmatic_launch = false failed"; }
n=$(steps "$work/plain.log")
((n == 3)) || fail "programmatic_launch = false trained $n steps, not 3"

# 3. run_owed.sh's retry.
OUT=$work/out
mkdir -p "$OUT"
START=$(date +%s)
LIMIT=600
source tests/gpu/run_lib.sh
st=0
run_unstuck "$work/retry.log" 300 "$plexus" train "${args[@]}" \
  --set output.dir=\""$work/retry"\" || st=$?
cat "$OUT/summary.txt"
((st == 0)) || { cat "$work/retry.log"; fail "run_unstuck's run ended with status $st"; }
grep -q "CAPTURE FAILED with programmatic launches (backend 'cuda': capture_end" "$OUT/summary.txt" ||
  fail "summary.txt does not say that the capture failed"
[[ -f $work/retry.log.capture ]] || fail "the failed try's log was not kept"
[[ " ${PDL_OFF[*]} " == *" plugins.options.cuda.programmatic_launch=false "* ]] ||
  fail "the option is not kept for the later runs of the call"
n=$(steps "$work/retry.log")
((n == 3)) || fail "the retried run trained $n steps, not 3"
# A later run of the call starts with the option.
run_unstuck "$work/later.log" 300 "$plexus" train "${args[@]}" \
  --set output.dir=\""$work/later"\" || fail "a later run of the call failed"
[[ ! -f $work/later.log.capture ]] || fail "a later run of the call tried programmatic launches again"
echo "a refused capture names its way round, and run_owed.sh takes it"
