#!/usr/bin/env bash
# The Tensor Core kernels' shared-memory requests on the emulated plugin (ctest runs it; see
# emu.cmake):
#   access_counts.sh PLEXUS_TESTS EMU_PLUGIN_DIR WORKDIR
# runs the igemm convolution candidates' match test in bf16 and f32 (every tile of the forward,
# backward data and weight gradient, with and without the pool epilogue, in every layout mix;
# f16's kernels are bf16's templates, addressing memory alike) and the mma.sync GEMM candidates
# with PLEXUS_EMU_ACCESS (tests/cuda/emu/README.md, "Memory access counts"), then holds every
# kernel and tile to one shared-memory wavefront a request for its ldmatrix reads and its
# 16-byte cp.async writes, and the TF32 channels-last forward's 4-byte filter copies (its only
# cp4) too. The 4-byte copies of NCHW activations (the TF32 A gather and weight gradient: 4
# wavefronts, docs/kernels.md) are printed, not held. Exit 77 (skipped) where the emulated
# plugin has no such kernel.
set -euo pipefail
tests=$1 emu=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
counts=$work/access.txt
for t in "cuda igemm convolution candidates match the cpu reference" \
         "every cuda tensor core gemm candidate matches the cpu"; do
  PLEXUS_EMU_ACCESS=$counts PLEXUS_TEST_PLUGIN_DIR=$emu PLEXUS_TEST_DTYPES=bf16,f32 "$tests" "$t" \
    > "$work/log.txt" 2>&1 ||
    { echo "'$t' failed:"; tail -20 "$work/log.txt"; exit 1; }
done
[[ -s $counts ]] || { echo "skipped: no ldmatrix or cp.async ran"; exit 77; }
python3 - "$counts" << 'EOF'
import re, sys
held, bad, shown = 0, [], {}
for line in open(sys.argv[1]):
    key, ldm, cp = line.rstrip("\n").split("\t")
    l = list(map(int, re.findall(r"\d+", ldm)))
    c = list(map(int, re.findall(r"\d+", cp)))
    kind = key.rsplit(" ", 1)[1]
    name = key.split(" smem ")[0]
    if kind == "ldmatrix":
        waves, ideal = l[1], l[2]
    else:
        waves, ideal = c[1], c[2]
    hold = kind in ("ldmatrix", "cp16") or (kind == "cp4" and name == "igemm_tf32_kernel<TL, Ix, true>")
    if hold:
        held += 1
        if waves != ideal:
            bad.append(f"{key}: {waves} wavefronts where {ideal} would do")
    else:
        s = shown.setdefault(f"{name} {kind}", [0, 0])
        s[0] += waves
        s[1] += ideal
for k, (w, i) in sorted(shown.items()):
    print(f"not held: {k}: {w / i:.2f} wavefronts a request")
for b in bad:
    print("FAILED:", b)
if bad or held == 0:
    sys.exit(1)
print(f"{held} kernel and tile counts: one shared-memory wavefront a request")
EOF
