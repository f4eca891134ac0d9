#!/usr/bin/env bash
# The implicit-GEMM convolutions copy their gathered activation through L1 and the operands no
# copy of the block reads twice through L2 only (docs/kernels.md, "Gathered activations through
# L1"): in SASS a 16-byte cp.async.ca is `LDGSTS.E.128` (or `.E.LTC128B.128`), a cp.async.cg
# `LDGSTS.E.BYPASS...128`. For every architecture the plugin was built for, every kernel of the
# 16-bit families must have L1-allocating 16-byte copies (x in the forward, dy in backward data,
# x in the weight gradients), and the mma.sync ones also L2-only copies (the filter; the weight
# gradient's dy). The Hopper tiles take their plain operand through the TMA, so only the first
# rule applies to them. Needs no GPU: it reads the plugin file with cuobjdump.
#
#   sass_check_l1.sh PLUGIN.so 80,90
#
# Tools as sass_check_conv.sh (sass_tools.sh); without them the check is skipped (exit 77).
set -euo pipefail

usage="usage: sass_check_l1.sh PLUGIN.so ARCHS"
so=${1:?$usage}
archs=${2:?$usage}
source "$(dirname "${BASH_SOURCE[0]}")/sass_tools.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dump_sass "$so" "$tmp/sass"

# Per (arch, kernel): 16-byte copies through L1 and through L2 only.
awk '
  /code for sm_/ { match($0, /sm_[0-9]+a?/); arch = substr($0, RSTART, RLENGTH) }
  /Function :/ { fn = $NF; if (fn ~ /igemm_(conv|wgrad|wgmma|wgmma_wgrad)_kernel/) { l1[arch " " fn] += 0; l2[arch " " fn] += 0 } }
  /LDGSTS[.A-Z0-9_]*\.128/ {
    if (!((arch " " fn) in l1)) next
    if ($0 ~ /LDGSTS[.A-Z0-9_]*BYPASS/) l2[arch " " fn]++; else l1[arch " " fn]++
  }
  END { for (k in l1) print k, l1[k], l2[k] }
' "$tmp/sass" | sort > "$tmp/copies"

fail=0
printf '%-6s %5s %5s  %s\n' arch L1 L2 kernel
while read -r arch fn n1 n2; do
  name=$(kernel_name "$fn")
  printf '%-6s %5s %5s  %s\n' "$arch" "$n1" "$n2" "$name"
  if [[ "$n1" -eq 0 ]]; then
    echo "FAIL: $arch $name copies no 16 bytes through L1 (its gathered activation)"
    fail=1
  fi
  if [[ "$fn" != *wgmma* && "$n2" -eq 0 ]]; then
    echo "FAIL: $arch $name copies nothing through L2 only (its filter, or the weight gradient's dy)"
    fail=1
  fi
done < "$tmp/copies"

IFS=';, ' read -r -a want <<< "$archs"
for a in "${want[@]}"; do
  a=${a%%-*}
  for p in igemm_conv_kernel igemm_wgrad_kernel; do
    n=$(awk -v a="sm_$a" -v re="$p" '($1 == a || $1 == a "a") && $2 ~ re' "$tmp/copies" | wc -l)
    echo "sm_$a: $n kernels matching $p"
    if [[ "$n" -eq 0 ]]; then echo "FAIL: no kernel matching $p in the SASS for sm_$a"; fail=1; fi
  done
done
if [[ "$fail" -ne 0 ]]; then exit 1; fi
echo "OK: every 16-bit igemm kernel gathers its activation through L1, the rest through L2 only"
