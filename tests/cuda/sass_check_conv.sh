#!/usr/bin/env bash
# Tensor Core kernels of the CUDA plugin must really use the Tensor Cores: for every architecture
# the plugin was built for, every kernel whose mangled name matches one of the given patterns
# must contain HMMA instructions in its SASS and must not spill to local memory. Needs no GPU:
# it reads the plugin file with cuobjdump.
#
#   [SASS_MMA=HGMMA] sass_check_conv.sh PLUGIN.so 80,90 PATTERN...
#
# SASS_MMA: the Tensor Core instruction to count (an awk regular expression), HMMA (mma.sync)
# unless set; the Hopper GEMM's wgmma kernels (built for sm_90a only: ARCHS 90) need HGMMA.
#
# ARCHS: the plugin's CUDA architectures, separated by commas or semicolons ("90-real" counts as
# 90).
# PATTERN is an awk regular expression matched against the mangled kernel names (the conv
# kernels: igemm_conv_kernel igemm_wgrad_kernel); each pattern must match at least one kernel per
# architecture. Prints one line per matching kernel: architecture, HMMA count, registers per
# thread, local memory (spills), then the demangled name.
#
# cuobjdump is taken from $CUOBJDUMP, PATH, the CUDA toolkit's bin directory or the pip package
# nvidia-cuda-cuobjdump; its --dump-sass needs nvdisasm, from $NVDISASM_PATH, PATH, the toolkit
# or the pip package nvidia-cuda-nvdisasm. Without them the check is skipped (exit 77), saying so.
set -euo pipefail

usage="usage: sass_check_conv.sh PLUGIN.so ARCHS PATTERN..."
so=${1:?$usage}
archs=${2:?$usage}
shift 2
[[ $# -gt 0 ]] || { echo "$usage"; exit 2; }
patterns=("$@")
mma=${SASS_MMA:-HMMA}

# cuobjdump and nvdisasm, or the skip (exit 77).
source "$(dirname "${BASH_SOURCE[0]}")/sass_tools.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dump_sass "$so" "$tmp/sass"
"$cuobjdump" --dump-resource-usage "$so" > "$tmp/res"

# The patterns as one awk alternation.
alt=$(IFS='|'; echo "${patterns[*]}")

# Per (arch, function): the HMMA count. cuobjdump prints "code for sm_XX" before each cubin and
# "Function : NAME" before each kernel.
awk -v re="$alt" -v mma="$mma" '
  /code for sm_/ { match($0, /sm_[0-9]+a?/); arch = substr($0, RSTART, RLENGTH) }
  /Function :/ { fn = $NF; if (fn ~ re) n[arch " " fn] += 0 }
  $0 ~ mma { if (fn ~ re) n[arch " " fn]++ }
  END { for (k in n) print k, n[k] }
' "$tmp/sass" | sort > "$tmp/hmma"
# Per (arch, function): registers and local memory.
awk -v re="$alt" '
  /code for sm_|arch = sm_/ { if (match($0, /sm_[0-9]+a?/)) arch = substr($0, RSTART, RLENGTH) }
  /Function / { fn = $2; sub(/:$/, "", fn) }
  /REG:/ {
    if (fn !~ re) next
    reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
    loc = $0; sub(/.*LOCAL:/, "", loc); sub(/ .*/, "", loc)
    print arch, fn, reg, loc
  }
' "$tmp/res" | sort > "$tmp/regs"

fail=0
printf '%-6s %5s %4s %5s  %s\n' arch "$mma" REG LOCAL kernel
while read -r arch fn count; do
  read -r reg loc < <(awk -v a="$arch" -v f="$fn" '$1 == a && $2 == f { print $3, $4; exit }' "$tmp/regs") || true
  name=$(kernel_name "$fn")
  printf '%-6s %5s %4s %5s  %s\n' "$arch" "$count" "${reg:-?}" "${loc:-?}" "$name"
  if [[ "$count" -eq 0 ]]; then echo "FAIL: $arch $name has no $mma instruction"; fail=1; fi
  if [[ -n "${loc:-}" && "$loc" != 0 ]]; then
    echo "FAIL: $arch $name spills ($loc bytes of local memory)"
    fail=1
  fi
done < "$tmp/hmma"

# Every pattern matches kernels on every requested architecture (a missing architecture would
# run JIT-compiled PTX, or nothing).
IFS=';, ' read -r -a want <<< "$archs"
for a in "${want[@]}"; do
  a=${a%%-*}  # "90-real" -> "90"
  for p in "${patterns[@]}"; do
    n=$(awk -v a="sm_$a" -v re="$p" '($1 == a || $1 == a "a") && $2 ~ re' "$tmp/hmma" | wc -l)
    echo "sm_$a: $n kernels matching $p"
    if [[ "$n" -eq 0 ]]; then echo "FAIL: no kernel matching $p in the SASS for sm_$a"; fail=1; fi
  done
done
if [[ "$fail" -ne 0 ]]; then exit 1; fi
echo "OK: every matching kernel has $mma instructions and no spills"
