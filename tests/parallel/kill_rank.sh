#!/usr/bin/env bash
# A rank that dies (kill) or hangs (stop) in the middle of a data-parallel training
# (ctest runs it; see tests/CMakeLists.txt):
#   kill_rank.sh PLEXUS COMPARE MPIEXEC WORKDIR kill|stop
# Starts 2 ranks, waits until some steps are logged, then SIGKILLs or SIGSTOPs rank 1. The job
# must end by itself with a non-zero status (a stopped peer: rank 0 times out after
# parallel.timeout_s, naming the operation) and leave the last checkpoint readable.
# PARALLEL_ARGS (environment): more arguments for the run, e.g. "--set parallel.pipeline_stages=2".
set -uo pipefail
plexus=$1 compare=$2 mpiexec=$3 work=$4 how=$5
rm -rf "$work"
mkdir -p "$work"
cat > "$work/kill.toml" <<TOML
[backend]
name = "cpu"
[plugins.options.cpu]
threads = 1
[model]
name = "mlp"
[data]
dataset = "fashion-mnist"
limit = 6000
[train]
epochs = 200
batch_size = 64
seed = 1
[parallel]
timeout_s = 3
[output]
dir = "$work/run"
checkpoint_steps = 5
[logging]
progress = "plain"
TOML
read -r -a par <<< "${PARALLEL_ARGS:-}"
"$mpiexec" -np 2 --oversubscribe --allow-run-as-root "$plexus" train "$work/kill.toml" "${par[@]}" \
  > "$work/log" 2>&1 &
job=$!
# Wait for 12 logged steps (two checkpoints).
for _ in $(seq 1 600); do
  n=$(grep -c '"type":"step"' "$work/run/metrics.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 12 ] && break
  kill -0 $job 2>/dev/null || { echo "the job ended before it was interrupted:"; cat "$work/log"; exit 1; }
  sleep 0.1
done
victim=""
for p in $(pgrep -P $job); do
  if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$p; fi
done
if [ -z "$victim" ]; then echo "no rank 1 among mpirun's children"; kill -9 $job; exit 1; fi
echo "== $how rank 1 (pid $victim) after $n steps"
if [ "$how" = kill ]; then kill -KILL "$victim"; else kill -STOP "$victim"; fi
# The job must end by itself: no hang.
status=""
for _ in $(seq 1 900); do
  if ! kill -0 $job 2>/dev/null; then wait $job; status=$?; break; fi
  sleep 0.1
done
if [ -z "$status" ]; then
  echo "HANG: the job was still running 90 s after rank 1 was interrupted"
  kill -CONT "$victim" 2>/dev/null
  pkill -KILL -P $job
  kill -KILL $job
  cat "$work/log"
  exit 1
fi
cat "$work/log" | grep -v 'ETA' | tail -n 15
echo "== the job ended with status $status"
[ "$status" -ne 0 ] || { echo "the job reported success"; exit 1; }
if [ "$how" = stop ]; then
  grep -q "did not complete within 3000 ms" "$work/log" ||
    { echo "no timeout naming the operation in the log"; exit 1; }
fi
# The last checkpoint is whole: it reads back (compared with itself).
"$compare" "$work/run" "$work/run" > /dev/null || { echo "the checkpoint does not read back"; exit 1; }
echo "the checkpoint reads back; the job failed cleanly"
