#!/usr/bin/env bash
# Helpers of the emulator's plexus-run tests (capture_refused.sh, kernel_fault.sh), sourced.
fail() { echo "FAILED: $*" >&2; exit 1; }
# The steps a run trained, from the metrics of the folder its log names (a run into a folder that
# an earlier try left writes to a new one beside it).
steps() {  # LOG
  local dir
  dir=$(sed -n 's/^training .*; writing //p' "$1" | tail -1)
  [[ -n $dir && -f $dir/metrics.jsonl ]] || { echo 0; return; }
  grep -c '"type":"step"' "$dir/metrics.jsonl" || true
}
