#!/usr/bin/env bash
# The CUDA plugin's own Tensor Core GEMM (plugins/cuda/ops/mma_gemm.cu) must really run on Tensor
# Cores: every mma_gemm_kernel instantiation, for every architecture the plugin was built for,
# must contain HMMA instructions in its SASS, and none may spill to local memory. Needs no GPU:
# it reads the plugin file with cuobjdump.
#
#   check_mma_sass.sh PLUGIN.so 80,90 [CUOBJDUMP]     (CMAKE_CUDA_ARCHITECTURES, ',' or ';')
#
# Prints one line per kernel: architecture, HMMA count, registers per thread, local memory
# (spills), static shared memory, then the kernel's name. cuobjdump is looked for in $CUOBJDUMP,
# the third argument, PATH, the CUDA toolkit's bin directory and the pip package
# nvidia-cuda-cuobjdump; without it the check is skipped (exit 77), saying so.
set -euo pipefail

so=${1:?usage: check_mma_sass.sh PLUGIN.so ARCHS [CUOBJDUMP]}
archs=${2:?usage: check_mma_sass.sh PLUGIN.so ARCHS [CUOBJDUMP]}
given=${3:-}

tool=""
for c in "${CUOBJDUMP:-}" "$given" "$(command -v cuobjdump || true)" /usr/local/cuda/bin/cuobjdump; do
  if [[ -n "$c" && -x "$c" ]]; then tool=$c; break; fi
done
if [[ -z "$tool" ]] && command -v python3 > /dev/null; then
  c=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in glob.glob(os.path.join(r, "nvidia", "cu*", "bin", "cuobjdump")) + \
             glob.glob(os.path.join(r, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump")):
        if os.access(p, os.X_OK):
            print(p)
            sys.exit(0)
PY
)
  [[ -n "$c" ]] && tool=$c
fi
if [[ -z "$tool" ]]; then
  echo "skipped: no cuobjdump (install the CUDA toolkit's cuobjdump, or: pip install nvidia-cuda-cuobjdump)"
  exit 77
fi
[[ -f "$so" ]] || { echo "FAIL: no plugin file $so"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$tool" --dump-sass "$so" > "$tmp/sass"
"$tool" --dump-resource-usage "$so" > "$tmp/res"

# Per (arch, function): HMMA count, from the SASS listing.
awk '
  /code for sm_/ { match($0, /sm_[0-9]+a?/); arch = substr($0, RSTART, RLENGTH) }
  /Function :/ { fn = $NF; if (fn ~ /mma_gemm_kernel/) n[arch " " fn] += 0 }
  /HMMA/ { if (fn ~ /mma_gemm_kernel/) n[arch " " fn]++ }
  END { for (k in n) print k, n[k] }
' "$tmp/sass" | sort > "$tmp/hmma"
# Per (arch, function): registers, local memory (spills), static shared memory.
awk '
  /^arch = / { arch = $3 }
  /Function / { fn = $2; sub(/:$/, "", fn) }
  /REG:/ {
    if (fn !~ /mma_gemm_kernel/) next
    reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
    loc = $0; sub(/.*LOCAL:/, "", loc); sub(/ .*/, "", loc)
    sh = $0; sub(/.*SHARED:/, "", sh); sub(/ .*/, "", sh)
    print arch, fn, reg, loc, sh
  }
' "$tmp/res" | sort > "$tmp/regs"

fail=0
printf '%-6s %5s %4s %5s %6s  %s\n' arch HMMA REG LOCAL SHARED kernel
while read -r arch fn count; do
  reg="" loc="" sh=""
  read -r reg loc sh < <(awk -v a="$arch" -v f="$fn" '$1 == a && $2 == f { print $3, $4, $5; exit }' "$tmp/regs") || true
  name=$( (echo "$fn" | c++filt 2> /dev/null || echo "$fn") |
    sed -e 's/plexus::cuda::(anonymous namespace):://g' -e 's/plexus::cuda:://g' -e 's/>(.*$/>/')
  printf '%-6s %5s %4s %5s %6s  %s\n' "$arch" "$count" "${reg:-?}" "${loc:-?}" "${sh:-?}" "$name"
  if [[ "$count" -eq 0 ]]; then echo "FAIL: $arch $name has no HMMA instruction"; fail=1; fi
  if [[ -n "${loc:-}" && "$loc" != 0 ]]; then echo "FAIL: $arch $name spills ($loc bytes of local memory)"; fail=1; fi
done < "$tmp/hmma"

# Every requested architecture has the kernels (an architecture whose SASS is missing would
# run JIT-compiled PTX, or nothing).
IFS=';,' read -r -a want <<< "$archs"
for a in "${want[@]}"; do
  a=${a%%-*}  # "90-real" -> "90"
  n=$(awk -v a="sm_$a" '$1 == a || $1 == a "a"' "$tmp/hmma" | wc -l)
  if [[ "$n" -eq 0 ]]; then echo "FAIL: no mma_gemm_kernel in the SASS for sm_$a"; fail=1; fi
  echo "sm_$a: $n Tensor Core GEMM kernels"
done
if [[ "$fail" -ne 0 ]]; then exit 1; fi
echo "OK: every Tensor Core GEMM kernel has HMMA instructions and no spills"
