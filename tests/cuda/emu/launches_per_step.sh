#!/usr/bin/env bash
# Kernel launches per training step on the CUDA emulator: the launch trace (PLEXUS_EMU_TRACE, a
# cuBLASLt or cuDNN call counted as one) of a 4-step `plexus train` minus that of a 3-step one,
# so set-up, tuning and the first step's capture cancel out. The library side and cuDNN's
# heuristic by default (the figures in docs/benchmarks.md); later --set arguments override them.
#
#   tests/cuda/emu/launches_per_step.sh MODEL PRECISION [--set key=value ...]
#   e.g. tests/cuda/emu/launches_per_step.sh convnet bf16 --set train.batch_size=64
#
# Run from the checkout after building (build/bin/plexus, build/emu-plugins). Prints
# "MODEL PRECISION: N launches per step, M host operations per step", where M counts what the
# host itself puts on a stream per step (PLEXUS_EMU_HOST_TRACE: launches, copies, library calls,
# event records and waits, graph launches; not what a captured graph replays); with
# PLEXUS_LAUNCH_LIST=1 also the kernels of one step and the host's operations (the lines whose
# count grew from 3 steps to 4). A kernel launched through a variable is
# traced by the variable's name: `kernel_` lines are the mma.sync GEMM (ops/mma_gemm.cu, MmaPlan),
# the models' linear layers on the native side.
set -euo pipefail
model=$1 precision=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trace() {  # steps, then the extra --set arguments
  local n=$1
  shift
  PLEXUS_EMU_TRACE="$work/trace-$n.txt" PLEXUS_EMU_HOST_TRACE="$work/host-$n.txt" build/bin/plexus train "configs/$model.toml" \
    --set backend.name=\"cuda\" --set 'plugins.paths=["build/emu-plugins"]' \
    --set train.max_steps="$n" --set train.eval=false --set data.limit=1280 \
    --set backend.kernels=\"library\" --set plugins.options.cuda.benchmark=false \
    --set train.precision=\""$precision"\" --set logging.progress=\"none\" \
    --set output.dir=\""$work/run-$n"\" "$@" > "$work/log-$n.txt" 2>&1 ||
    { echo "plexus train failed:" >&2; tail -5 "$work/log-$n.txt" >&2; exit 1; }
}
steps=3
trace $steps "$@"
trace $((steps + 1)) "$@"
a=$(wc -l < "$work/trace-$steps.txt")
b=$(wc -l < "$work/trace-$((steps + 1)).txt")
ha=$(wc -l < "$work/host-$steps.txt")
hb=$(wc -l < "$work/host-$((steps + 1)).txt")
echo "$model $precision: $((b - a)) launches per step, $((hb - ha)) host operations per step"
if [[ ${PLEXUS_LAUNCH_LIST:-0} == 1 ]]; then
  for f in trace host; do
    echo "-- ${f} lines that grew from $steps steps to $((steps + 1)) (count at $((steps + 1))):"
    diff <(sort "$work/$f-$steps.txt" | uniq -c) <(sort "$work/$f-$((steps + 1)).txt" | uniq -c) |
      sed -n 's/^> *//p' || true  # diff exits 1 when the traces differ
  done
fi
