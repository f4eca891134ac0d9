#!/usr/bin/env bash
# Data parallelism against one process (ctest runs it; see tests/CMakeLists.txt):
#   dp_train.sh PLEXUS COMPARE MPIEXEC RANKS WORKDIR [MODE] [--set k=v ...]
# trains the MLP on the first 1000 Fashion-MNIST images once in one process and once on RANKS
# ranks under MPI with the same global batch and seed, and holds the two runs' losses and final
# checkpoints to each other (f32 sums in another order: rtol 1e-4). The learning rate is one at
# which training is stable: at 0.05 with momentum 0.9 the losses jump, and the f32 rounding of
# sums taken in another order (OpenBLAS's kernels split a 60-row GEMM unlike two of 30 rows, and
# differently on each CPU) grew from 1e-7 to past the tolerance within 34 steps on an Intel Xeon,
# while at 0.02 the runs stay within 1e-7. The batch of 60 leaves a
# padded last batch of 40 samples, so with 4 ranks one rank's slice is all padding.
# MODE "resume": the parallel run stops after 7 steps and is resumed on the same ranks.
# MODE "alone": only the parallel run, which must finish (the ranks' loss scales are checked
# each step), report its replicas identical at every checkpoint (data parallelism) and, in f16,
# skip some steps: for runs one process need not match (an f16 rank rounds its half of a weight
# gradient to f16 apart from the whole batch's, so where one process overflows the ranks may
# not, and the skips differ).
# PARALLEL_ARGS (environment): more arguments for the parallel runs only, e.g.
# "--set parallel.pipeline_stages=2".
set -euo pipefail
plexus=$1 compare=$2 mpiexec=$3 ranks=$4 work=$5
shift 5
mode=plain
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then mode=$1; shift; fi
rm -rf "$work"
mkdir -p "$work"
cat > "$work/dp.toml" <<TOML
[backend]
name = "cpu"
[plugins.options.cpu]
threads = 1
[model]
name = "mlp"
[data]
dataset = "fashion-mnist"
limit = 1000
partial_batch = "pad"
[train]
epochs = 2
batch_size = 60
lr = 0.02
seed = 7
[parallel]
bucket_size = "256KiB"
timeout_s = 120
[logging]
progress = "plain"
TOML
launch=("$mpiexec" -np "$ranks" --oversubscribe --allow-run-as-root)
read -r -a par <<< "${PARALLEL_ARGS:-}"
if [ "$mode" != alone ]; then
  echo "== one process"
  "$plexus" train "$work/dp.toml" --set "output.dir=\"$work/one\"" "$@"
fi
echo "== $ranks ranks ($mode)"
if [ "$mode" = resume ]; then
  "${launch[@]}" "$plexus" train "$work/dp.toml" --set "output.dir=\"$work/dp\"" --set train.max_steps=7 "${par[@]}" "$@"
  "${launch[@]}" "$plexus" train "$work/dp.toml" --resume "$work/dp" --set train.max_steps=0 "${par[@]}" "$@"
else
  "${launch[@]}" "$plexus" train "$work/dp.toml" --set "output.dir=\"$work/dp\"" "${par[@]}" "$@" |
    tee "$work/dp.log"
fi
if [ "$mode" = alone ]; then
  # Data parallelism checks its replicas at each checkpoint (a pipeline's stages hold different
  # layers); every launch checks each step that the ranks ran with one loss scale.
  if [[ "${PARALLEL_ARGS:-}" != *pipeline_stages* ]]; then
    grep -q "ranks' parameters and states were identical at each of" "$work/dp.log" ||
      { echo "the run did not report its replicas identical" >&2; exit 1; }
  fi
  if grep -q '"loss_scale"' "$work/dp/metrics.jsonl"; then
    skipped=$(grep '"type":"step"' "$work/dp/metrics.jsonl" | grep -c '"skipped":true' || true)
    [ "$skipped" -gt 0 ] || { echo "no step was skipped: the test's loss scale is too small" >&2; exit 1; }
    echo "the $ranks ranks skipped $skipped steps alike"
  fi
  exit 0
fi
tr -d ' \n' < "$work/dp/manifest.json" | grep -q '"parallel":{"ranks":'"$ranks" ||
  { echo "manifest.json does not record $ranks ranks" >&2; exit 1; }
# train.target_accuracy among the arguments: both runs stop at the same epoch, each writing one
# "target" line (every rank sees the global test accuracy, so the ranks stop together).
if [[ " $* " == *train.target_accuracy=* ]]; then
  for run in one dp; do
    grep -o '"type":"target","target_accuracy":[^,]*,"epoch":[0-9]*' "$work/$run/metrics.jsonl" \
      > "$work/$run.target" || { echo "the $run run did not reach its target" >&2; exit 1; }
  done
  cmp -s "$work/one.target" "$work/dp.target" ||
    { echo "the runs stopped at different epochs: $(cat "$work/one.target") / $(cat "$work/dp.target")" >&2; exit 1; }
  echo "both runs stopped at the target: $(cat "$work/dp.target")"
fi
echo "== compare"
# COMPARE_TOL: AdamW divides by the root of the second moment, so a weight whose gradient is
# near 0 moves by up to lr on last-bit differences; its test widens atol.
read -r -a tol <<< "${COMPARE_TOL:---rtol 1e-4 --atol 1e-6}"
"$compare" "$work/one" "$work/dp" "${tol[@]}"
# f16: the loss scale and the skipped steps, step by step, as one process had them (for a scale
# at which neither overflows: see "alone" above).
if grep -q '"loss_scale"' "$work/one/metrics.jsonl"; then
  for run in one dp; do
    grep '"type":"step"' "$work/$run/metrics.jsonl" |
      grep -o '"loss_scale":[^,}]*,"skipped":[a-z]*' > "$work/$run.scales"
  done
  if ! cmp -s "$work/one.scales" "$work/dp.scales"; then
    echo "the runs' loss scales differ (one process, then $ranks ranks):" >&2
    diff "$work/one.scales" "$work/dp.scales" | head -20 >&2
    exit 1
  fi
  echo "loss scales agree: $(wc -l < "$work/dp.scales") steps, $(grep -c true "$work/dp.scales") skipped"
fi
