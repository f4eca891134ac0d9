#!/usr/bin/env bash
# The run helpers of tests/gpu/run_owed.sh (sourced by it, and by the emulator's test of the
# capture retry, tests/cuda/emu/capture_refused.sh). They need OUT (summary.txt goes there),
# START (this call's start, seconds since the epoch) and LIMIT (seconds this call may take).
# The device tool stops a call at 600 s and keeps only what $OUT holds then. Every command of
# run_owed.sh runs through run_for MAX: a time limit of MAX seconds or what is left of LIMIT,
# whichever is less; with under 20 s left it is skipped, and summary.txt says so, so that the
# next call can run just that part (PHASES). A command cut short leaves its log.
run_for() {
  local max=$1
  shift
  local left=$((LIMIT - ($(date +%s) - START)))
  ((left < max)) && max=$left
  if ((max < 20)); then
    echo "SKIPPED, out of time in this call: $*" | cut -c1-200 | tee -a "$OUT/summary.txt"
    return 125
  fi
  timeout "$max" "$@"
}

# A candidate that never completes while the tuner times it (a kernel that deadlocks on this GPU)
# ends plexus after backend.tune_timeout_s (20 s here) with status 3, naming it, and so does one
# that faults while timed (the device is unusable after it): the command then runs again with
# that kernel kept out, and so does every later run of this call (PLEXUS_EXCLUDE_KERNELS), at
# most three kernels a command. Its log: LOG (each such try's beside it as LOG.stuckN). A step
# whose kernels have not completed after backend.step_timeout_s (30 s here) ends plexus too.
TIMEOUTS=(--set backend.tune_timeout_s=20 --set backend.step_timeout_s=30)
# A run that fails capturing its step (capture_end or graph_launch: the captured step's
# programmatic edges never ran on hardware before, docs/gpu-owed.md, thirty-seventh session)
# runs once more with programmatic launches off, and so does every later run of this call
# (PDL_OFF), so that a refused capture costs one run, not every figure of the call.
PDL_OFF=()
refused_capture() {  # LOG: the error of a run that failed capturing or replaying its step, if any
  grep -m1 -oE "backend 'cuda': (capture_end|graph_launch).{0,160}" "$1"
}
# A run that a kernel's fault or hang ended outside the tuner (a kernel not timed: the CUDA
# plugin's fault message and plexus's stuck step both say "a kernel failed / may hang on the
# device (backend.check_kernels = true names the kernel)") runs once more with
# backend.check_kernels, which waits for each kernel and names the one that faults or hangs, with
# status 3; the loop below then keeps that kernel out and runs the command as it was. If that run
# passes, its figures are not the command's (each kernel waited for, nothing captured), and a
# fault that waiting for each kernel hides points at kernels overlapping: the command runs once
# more as it was, with programmatic launches off.
unnamed_kernel() {  # LOG: what a run said that a kernel it does not name ended, if so
  local said="[^;]{0,200}; a kernel (failed|may hang) on the device"
  grep -q 'PLEXUS_EXCLUDE_KERNELS=' "$1" && return 1
  # The error the run ended with, else the first warning that said so.
  grep -E "plexus: error:|\[critical\]" "$1" | grep -m1 -oE "$said" || grep -m1 -oE "$said" "$1"
}
run_unstuck() {  # LOG MAX COMMAND...
  local log=$1 max=$2 st=0 k try why
  shift 2
  for try in 1 2 3 4; do
    run_for "$max" "$@" "${PDL_OFF[@]}" > "$log" 2>&1
    st=$?
    if ((st != 0 && st != 3 && st != 124 && st != 125 && ${#PDL_OFF[@]} == 0)) &&
      why=$(refused_capture "$log"); then
      cp "$log" "$log.capture"
      PDL_OFF=(--set plugins.options.cuda.programmatic_launch=false)
      echo "CAPTURE FAILED with programmatic launches ($why); they are off from here on" |
        tee -a "$OUT/summary.txt"
      run_for "$max" "$@" "${PDL_OFF[@]}" > "$log" 2>&1
      st=$?
    fi
    if ((st != 0 && st != 124 && st != 125)) && why=$(unnamed_kernel "$log"); then
      cp "$log" "$log.fault$try"
      echo "FAULTED OR STUCK ($why); running it again with backend.check_kernels to name the kernel" |
        tee -a "$OUT/summary.txt"
      run_for "$max" "$@" "${PDL_OFF[@]}" --set backend.check_kernels=true > "$log" 2>&1
      st=$?
      if ((st == 0)); then
        cp "$log" "$log.checked$try"
        PDL_OFF=(--set plugins.options.cuda.programmatic_launch=false)
        echo "NO FAULT with backend.check_kernels (kernels overlapping?); running it as it was," \
          "with programmatic launches off from here on" | tee -a "$OUT/summary.txt"
        run_for "$max" "$@" "${PDL_OFF[@]}" > "$log" 2>&1
        st=$?
      fi
    fi
    ((st == 3 && try < 4)) || return $st
    k=$(grep -o 'PLEXUS_EXCLUDE_KERNELS=[^ ]*' "$log" | tail -1 | cut -d= -f2)
    [[ -n $k ]] || return $st
    cp "$log" "$log.stuck$try"
    export PLEXUS_EXCLUDE_KERNELS=${PLEXUS_EXCLUDE_KERNELS:+$PLEXUS_EXCLUDE_KERNELS,}$k
    echo "STUCK OR FAULTED: $k; PLEXUS_EXCLUDE_KERNELS=$PLEXUS_EXCLUDE_KERNELS from here on" |
      tee -a "$OUT/summary.txt"
  done
  return $st
}
