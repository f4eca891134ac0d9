#!/usr/bin/env bash
# The plugin's kernels may start while the kernel before them on the stream is still running
# (launch_kernel, plugins/cuda/device.cuh: programmatic dependent launch), so each must wait for
# it before touching global memory. In the SASS of every architecture from sm_90 up, every kernel
# of the plugin (plexus::cuda, not the libraries' cub kernels) must have a wait (ACQBULK, from
# griddepcontrol.wait) and a trigger (PREEXIT, griddepcontrol.launch_dependents), and no global
# memory instruction (LDG, STG, generic LD/ST/ATOM, RED, LDGSTS, the TMA's UTMALDG, ...) at an
# address before its first wait: code before it in address order is all that can run before it.
# Below sm_90 there must be no wait at all (the PTX has none to give; the host launches those
# kernels the ordinary way). Needs no GPU: it reads the plugin file with cuobjdump.
#
#   sass_check_pdl.sh PLUGIN.so ARCHS
#
# ARCHS: the plugin's CUDA architectures, separated by commas or semicolons; each must have
# kernels in the file. Prints, per architecture, the kernels checked; each failure names the
# kernel. Skipped (exit 77) without cuobjdump and nvdisasm (sass_tools.sh).
set -euo pipefail

usage="usage: sass_check_pdl.sh PLUGIN.so ARCHS"
so=${1:?$usage}
archs=${2:?$usage}

source "$(dirname "${BASH_SOURCE[0]}")/sass_tools.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dump_sass "$so" "$tmp/sass"

# One line per (architecture, kernel): arch, mangled name, waits, triggers, and the number of
# global memory instructions before the first wait. An instruction line reads
# "/*0040*/  [@P0] OPCODE.MODIFIERS operands ;".
awk '
  function flush() { if (fn != "") print arch, fn, waits, triggers, early }
  /code for sm_/ { flush(); fn = ""; match($0, /sm_[0-9]+a?/); arch = substr($0, RSTART, RLENGTH) }
  /Function :/ { flush(); fn = $NF; waits = 0; triggers = 0; early = 0 }
  /^ *\/\*[0-9a-f]+\*\// {
    if (fn == "") next
    op = $2
    if (op ~ /^@/) op = $3
    base = op
    sub(/\..*/, "", base)
    if (base == "ACQBULK") waits++
    else if (base == "PREEXIT") triggers++
    else if (waits == 0 && base ~ /^(LDG|STG|LD|ST|ATOM|ATOMG|RED|LDGSTS|UTMALDG|UTMASTG|UTMAREDG|UBLKCP|UBLKRED|SULD|SUST|SURED|SUATOM)$/)
      early++
  }
  END { flush() }
' "$tmp/sass" > "$tmp/kernels"

fail=0
IFS=';, ' read -r -a want <<< "$archs"
for a in "${want[@]}"; do
  a=${a%%-*}  # "90-real" -> "90"
  checked=0
  while read -r arch fn waits triggers early; do
    [[ "$arch" == "sm_$a" || "$arch" == "sm_${a}a" ]] || continue
    # Only the plugin's own kernels (their names start with the namespace, after a template's
    # return type): the libraries' (cub) launch themselves.
    full=$(demangle "$fn")
    [[ "${full#void }" == "plexus::cuda::"* ]] || continue
    name=$(short_kernel_name "$full")
    checked=$((checked + 1))
    if [[ "$a" -ge 90 ]]; then
      if [[ "$waits" -eq 0 ]]; then echo "FAIL: $arch $name has no ACQBULK (pdl_wait)"; fail=1; fi
      if [[ "$triggers" -eq 0 ]]; then echo "FAIL: $arch $name has no PREEXIT (pdl_trigger)"; fail=1; fi
      if [[ "$early" -gt 0 ]]; then
        echo "FAIL: $arch $name has $early global memory instructions before its first ACQBULK"
        fail=1
      fi
    elif [[ "$waits" -gt 0 || "$triggers" -gt 0 ]]; then
      echo "FAIL: $arch $name has ACQBULK or PREEXIT below sm_90"
      fail=1
    fi
  done < "$tmp/kernels"
  echo "sm_$a: $checked kernels of the plugin checked"
  if [[ "$checked" -eq 0 ]]; then echo "FAIL: no kernel of the plugin in the SASS for sm_$a"; fail=1; fi
done
if [[ "$fail" -ne 0 ]]; then exit 1; fi
echo "OK: from sm_90 up every kernel waits (ACQBULK) before any global memory access and triggers (PREEXIT); below, none does"
