#!/usr/bin/env bash
# Runs, in one call on the GPU machine, what docs/gpu-owed.md lists: build, the whole suite, the
# CUDA tests under compute-sanitizer, and the training benchmarks beside PyTorch's. Every log goes
# to $OUT (the device tool brings that folder back). Stage first, on the dev machine:
# `bash tests/gpu/stage_deps.sh` (toml++ in .deps/include, the peer scripts in .deps/bench,
# Fashion-MNIST in .deps/fashion-mnist, and the C++ libraries the GPU image may lack in
# .deps/sysdeps.tar.xz); then: run(command="bash tests/gpu/run_owed.sh", carry=[".deps"]).
#
#   PHASES="build tests goals sanitize compare kernels train tta torch" (default: all)   EPOCHS=3
#   also "goalprofile" (the goal steps kernel by kernel, bf16 GEMMs), "ncu" (Nsight Compute on
#   our convolution kernels in the convnet bf16 step; after goalprofile), "ncugemm" (Nsight
#   Compute on one launch of each persistent Hopper GEMM tile and of cuBLASLt's kernel at 8192 in
#   bf16, about 90 s: a second call) and "racecheck" (three tests with last-block counters). The
#   device allows 15 minutes a session, a fresh machine's start and this build (70 s) included:
#   the first call of a session is best
#   PHASES="build gputests goals goalprofile ncu" with LIMIT=550 and timeout_s=585.
#   "recipes": other recipes to 91% with convnet (the short one in bf16, AdamW for two epochs at
#   batch 256 for both sides), for a second call (PHASES="recipes" LIMIT=250) while the machine
#   is warm.
#   "gputests" instead of "tests": only the tests that need the GPU (the CPU ones run in CI), each
#   its own process under ctest with a time limit, so a hang or crash costs one test, not the call;
#   their failures' output comes back on its own in failures.txt.
#   TARGETS=all builds everything, the CUDA emulator's variants too (minutes on 16 cores); by
#   default only what runs on the GPU is built.
#   "ab": the goal steps (`plexus bench step`, convnet b1024 bf16 and simplecnn b128 f32) of this
#   tree against an earlier commit's, in turns, in the same call: stage that commit's source on
#   the dev machine first (`rm -rf .deps/base-src && mkdir -p .deps/base-src && git archive
#   COMMIT | tar -x -C .deps/base-src`, COMMIT as docs/gpu-owed.md says); it builds in
#   build-gpu-base (about 70 s more on 16 cores). Put it after "build".
#   (benchmarks)   LIMIT=570 (seconds this call may take; see run_for)
#   PLEXUS_EXCLUDE_KERNELS=igemm_wgmma_*,... keeps those kernels out of every run but the tests
#   (backend.exclude_kernels): a second call after a family failed its tests measures the goals
#   without it. summary.txt says which list a call had.
set -uo pipefail
cd "$(dirname "$0")/../.."
# The device tool brings back at most 8 files from $OUT: the logs go to a folder of their own and
# come back as one archive (logs.tgz) beside summary.txt, made on exit (also when a phase fails).
DEST=${OUT:-$PWD/gpu-out}
mkdir -p "$DEST"
OUT=$(mktemp -d /tmp/plexus-gpu.XXXXXX)
# A file over 16 MiB does not come back at all (the first GPU session lost every log so): logs
# over 2 MiB keep their first and last MiB in the archive, and failures.txt (each failed test's
# output, cut to 40 kB) comes back beside it on its own.
pack() {
  cp -f "$OUT/summary.txt" "$DEST/" 2> /dev/null
  cp -f "$OUT/failures.txt" "$DEST/" 2> /dev/null
  find "$OUT" -type f -size +2M | while read -r f; do
    { head -c 1M "$f"; printf '\n[... cut by run_owed.sh ...]\n'; tail -c 1M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
  done
  tar czf "$DEST/logs.tgz" -C "$OUT" . 2> /dev/null
}
trap pack EXIT
PHASES=${PHASES:-"build tests goals sanitize compare kernels train tta torch"}
EPOCHS=${EPOCHS:-3}
DATA=$PWD/.deps/fashion-mnist
B=build-gpu
has() { [[ " $PHASES " == *" $1 "* ]]; }
stamp() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
[[ -n ${PLEXUS_EXCLUDE_KERNELS:-} ]] &&
  echo "PLEXUS_EXCLUDE_KERNELS=$PLEXUS_EXCLUDE_KERNELS (every run but the tests)" >> "$OUT/summary.txt"
# The device tool stops a call at 600 s and keeps only what $OUT holds then: run_for, run_unstuck
# and the retries in tests/gpu/run_lib.sh, with LIMIT seconds from START.
START=$(date +%s)
LIMIT=${LIMIT:-570}
source tests/gpu/run_lib.sh

# `plexus bench step` of configs/MODEL.toml on CUDA at BATCH in PREC, then any further arguments
# (--set ...), under run_for MAX: its log and JSON as bench-step-TAG.*, its head in the summary.
bench_step() {  # TAG MAX MODEL BATCH PREC [ARGS...]
  local tag=$1 max=$2 model=$3 batch=$4 prec=$5
  shift 5
  stamp "plexus bench step: $tag"
  run_unstuck "$OUT/bench-step-$tag.log" "$max" $B/bin/plexus bench step configs/$model.toml --backend cuda \
    --set train.batch_size=$batch --set train.precision=\"$prec\" --set data.path=\"$DATA\" \
    "${TIMEOUTS[@]}" --steps 20 --top 15 "$@" --json "$OUT/bench-step-$tag.json"
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -v '\[debug\]' "$OUT/bench-step-$tag.log" | head -30 | tee -a "$OUT/summary.txt"
  # With --log-level debug: what the tuner made of each fused group ("timed as a whole").
  grep -E 'timed as a whole' "$OUT/bench-step-$tag.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
}

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

# The C++ libraries carried in .deps/sysdeps.tar.xz (tests/gpu/stage_deps.sh: Debian's Boost,
# spdlog and fmt, CLI11, Catch2, zlib and OpenBLAS, one prefix each), for an image that lacks
# them (the H200's `cuda` image is a Python one): CMake searches them after the system's own.
FALLBACK=()
prefixes=
if [[ -f .deps/sysdeps.tar.xz ]]; then
  if [[ ! -d .deps/sys ]]; then
    mkdir -p .deps/sys
    tar -C .deps/sys -xJf .deps/sysdeps.tar.xz 2> /dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .deps/sysdeps.tar.xz .deps/sys
  fi
  # One prefix per folder of the archive (stage_deps.sh names them).
  prefixes=$(printf "%s;" "$PWD"/.deps/sys/*/ | sed 's|/;|;|g')
  FALLBACK=(-DPLEXUS_FALLBACK_PREFIXES="${prefixes%;}")
fi

# What the machine's image has of what the build needs, before the build tries it: on a new
# image a failed configure then says all of it in one call.
preflight() {
  {
    echo "compilers: $(g++ --version 2>&1 | head -1); $(cmake --version 2>&1 | head -1); nvcc $(command -v nvcc) $(nvcc --version 2>&1 | tail -2 | head -1)"
    for h in boost/dll.hpp spdlog/spdlog.h fmt/format.h CLI/CLI.hpp catch2/catch.hpp \
             catch2/catch_session.hpp zlib.h toml++/toml.h nccl.h cudnn_version.h; do
      found=
      for d in /usr/include /usr/include/x86_64-linux-gnu /usr/local/include /usr/local/cuda/include; do
        [[ -e $d/$h ]] && { found=$d/$h; break; }
      done
      [[ -n $found ]] || found=$(find /usr/include /usr/local -maxdepth 4 -path "*/$h" 2> /dev/null | head -1)
      echo "  header $h: ${found:-none}"
    done
    echo "  cblas.h: $(find /usr/include -name cblas.h 2> /dev/null | head -2 | tr '\n' ' ')"
    for l in libopenblas libz.so libgfortran libspdlog libcudnn.so libnccl.so libcublasLt libmpi.so; do
      echo "  library $l: $(ldconfig -p 2> /dev/null | grep -m2 "$l" | awk '{print $NF}' | tr '\n' ' ')"
    done
    echo "  python's nvidia wheels: $(python3 -c 'import nvidia, os; print(" ".join(sorted(os.listdir(list(nvidia.__path__)[0]))))' 2>&1 | tail -1)"
    echo "  mpirun: $(command -v mpirun || echo none); ncu: $(command -v ncu || echo none); cuobjdump: $(command -v cuobjdump || echo none)"
  } 2>&1 | tee -a "$OUT/summary.txt"
}

if has build; then
  stamp build
  preflight
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="$PWD/.deps" "${FALLBACK[@]}" -DPLEXUS_CUDA_EMULATOR=${EMULATOR:-OFF} \
    > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log" | tee -a "$OUT/summary.txt"; exit 1; }
  # Which libraries came from the carried prefixes, and where cuDNN and NCCL were found.
  grep -E '^(Boost_DIR|spdlog_DIR|CLI11_DIR|Catch2_DIR|ZLIB_LIBRARY_RELEASE|PLEXUS_OPENBLAS_LIBRARY|PLEXUS_CUDNN_LIBRARY|PLEXUS_NCCL_LIBRARY|PLEXUS_CUDNN_INCLUDE_DIR)[:=]' \
    $B/CMakeCache.txt | tee -a "$OUT/summary.txt"
  grep -E 'CUDA plugin|NCCL plugin|MPI plugin|not built' "$OUT/configure.log" | tee -a "$OUT/summary.txt"
  targets=()
  known=$(cmake --build $B --target help 2>/dev/null)
  for t in plexus plexus_tests plexus_plugin_cpu plexus_plugin_cuda plexus_plugin_nccl \
           plexus_plugin_mpi plexus_comm_conformance; do
    grep -q "^$t:" <<< "$known" && targets+=(--target $t)
  done
  [[ ${TARGETS:-} == all ]] && targets=()
  /usr/bin/time -f "build wall %e s" cmake --build $B -j16 "${targets[@]}" -- -k 0 > "$OUT/build.log" 2>&1 ||
    grep -E 'error' -A5 "$OUT/build.log" | head -60
  # A file that fails (a header gcc 13 wants, say) costs its own target, not the whole call.
  [[ -x $B/bin/plexus ]] || exit 1
  tail -1 "$OUT/build.log" | tee -a "$OUT/summary.txt"
  $B/bin/plexus info > "$OUT/info.txt" 2>&1
  grep -A2 'cuda (plugin' "$OUT/info.txt" | tee -a "$OUT/summary.txt"
fi

# A cuDNN or NCCL from Python's wheels (site-packages/nvidia/...): the plugins link them by path,
# and cuDNN loads its sub-libraries (engines, graph) from its own folder; the folders go on the
# loader's path for every later phase too (they are PyTorch's own, so its runs load the same).
if [[ -f $B/CMakeCache.txt ]]; then
  for v in PLEXUS_CUDNN_LIBRARY PLEXUS_NCCL_LIBRARY; do
    lib=$(grep -E "^$v:" $B/CMakeCache.txt | cut -d= -f2-)
    [[ $lib == */site-packages/* ]] && export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
  [[ -n ${LD_LIBRARY_PATH:-} ]] && echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$OUT/summary.txt"
fi

if has ab; then
  # A change's worth on the GPU, measured against the commit before it in one call (a ratio
  # across calls or machines says little): both builds' goal steps, base then head, twice.
  if [[ -f .deps/base-src/CMakeLists.txt ]]; then
    stamp "ab: build the base (.deps/base-src)"
    BB=build-gpu-base
    # (An earlier commit may not know PLEXUS_FALLBACK_PREFIXES: the carried prefixes go into
    # CMAKE_PREFIX_PATH there, searched before the system's.)
    cmake -S .deps/base-src -B $BB -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$PWD/.deps${prefixes:+;${prefixes%;}}" -DPLEXUS_CUDA_EMULATOR=OFF \
      > "$OUT/configure-base.log" 2>&1
    run_for 200 cmake --build $BB -j16 --target plexus plexus_plugin_cpu plexus_plugin_cuda \
      > "$OUT/build-base.log" 2>&1
    tail -1 "$OUT/build-base.log" | tee -a "$OUT/summary.txt"
    if [[ -x $BB/bin/plexus ]]; then
      for round in 1 2; do
        for side in base head; do
          saved=$B
          [[ $side == base ]] && B=$BB
          # Each side its own tuning cache (round 1 fills it, round 2 runs what it chose).
          cache=(--set backend.tune_cache=\"$OUT/tune-$side.cache\")
          bench_step "ab-$side-$round-convnet-b1024-bf16" 90 convnet 1024 bf16 "${cache[@]}"
          bench_step "ab-$side-$round-simplecnn-b128-f32" 60 simplecnn 128 f32 "${cache[@]}"
          B=$saved
        done
      done
    fi
  else
    echo "ab: no .deps/base-src staged, skipped" | tee -a "$OUT/summary.txt"
  fi
fi

if has tests; then
  stamp ctest
  run_for 600 env -u PLEXUS_EXCLUDE_KERNELS ctest --test-dir $B -j8 --output-on-failure > "$OUT/ctest.log" 2>&1
  tail -25 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
  stamp "cuda tests, verbose"
  run_for 600 $B/bin/plexus_tests "[cuda]" -s > "$OUT/cuda-tests-verbose.log" 2>&1
  run_for 600 $B/bin/plexus_tests "[cuda]" > "$OUT/cuda-tests.log" 2>&1
  tail -40 "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
  stamp "cuda tests on our own kernels first (PLEXUS_TEST_KERNELS=native)"
  run_for 600 env PLEXUS_TEST_KERNELS=native $B/bin/plexus_tests "[cuda]" > "$OUT/cuda-tests-native.log" 2>&1
  tail -40 "$OUT/cuda-tests-native.log" | tee -a "$OUT/summary.txt"
  stamp "nccl conformance (one GPU, id bootstrapped over mpi)"
  if command -v mpirun > /dev/null; then
    run_for 300 mpirun --allow-run-as-root --oversubscribe -np 1 $B/bin/plexus_comm_conformance \
      --comm nccl --backend cuda --bootstrap mpi > "$OUT/nccl-conformance.log" 2>&1
    echo "exit $?" >> "$OUT/nccl-conformance.log"
    tail -25 "$OUT/nccl-conformance.log" | tee -a "$OUT/summary.txt"
    stamp "plexus bench comm over nccl (one GPU: one rank, so busbw is 0; time and overhead count)"
    run_for 500 mpirun --allow-run-as-root --oversubscribe -np 1 $B/bin/plexus bench comm \
      --backend cuda --json "$OUT/bench-comm-nccl.json" > "$OUT/bench-comm-nccl.log" 2>&1
    echo "exit $?" >> "$OUT/bench-comm-nccl.log"
    grep -E '^#|exit' "$OUT/bench-comm-nccl.log" | tail -8 | tee -a "$OUT/summary.txt"
  else
    echo "no mpirun on this machine: nccl conformance not run" | tee -a "$OUT/summary.txt"
  fi
fi

if has gputests; then
  # Every test that touches the GPU: the [cuda] cases (names with cuda or nccl, the fused-group
  # tests, the direct and igemm fusions ("one direct kernel", "one igemm kernel": until the
  # thirty-first session four of them were left out), the algorithm cache) and the SASS
  # checks; the emulator's are CI's.
  stamp "gpu tests (ctest, one process per test)"
  run_for 240 env -u PLEXUS_EXCLUDE_KERNELS ctest --test-dir $B -j4 --timeout 150 --output-on-failure \
    -R 'cuda|nccl|algorithm cache|relu pair|relu group|conv \+ max-pool|one direct kernel|one igemm kernel|HMMA|HGMMA' \
    -E 'emulator' \
    > "$OUT/gpu-tests.log" 2>&1
  grep -E 'tests passed|Failed|\*\*\*|Not Run|Skipped' "$OUT/gpu-tests.log" | head -40 | tee -a "$OUT/summary.txt"
  # Each failed, crashed or timed-out test's output as ctest printed it, cut to 40 kB a test (the
  # op suite's can run to megabytes): from its result line to the next test's line.
  awk '/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /{keep = /\*\*\*/ && !/\*\*\*Skipped/; n = 0}
       /^ *Start +[0-9]+: / || /tests passed, /{keep = 0}
       keep && n < 40000 {print; n += length($0) + 1}' "$OUT/gpu-tests.log" > "$OUT/failures.txt"
fi

# `plexus train` on CUDA with the data of this call, as the goals and recipes phases run it: TAG,
# then the config and --set arguments; its log as goal-TAG.log, its figures in the summary.
goal_train() {
  local tag=$1
  shift
  stamp "goal: plexus train $tag"
  run_unstuck "$OUT/goal-$tag.log" 200 $B/bin/plexus train "$@" --set backend.name=cuda \
    --set data.path=\"$DATA\" "${TIMEOUTS[@]}" --set logging.progress=plain \
    --set output.dir=\"$OUT/runs/goal-$tag\"
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -E 'img/s|target test accuracy|capturing the work around' "$OUT/goal-$tag.log" | tail -5 | tee -a "$OUT/summary.txt"
}

# An AdamW recipe (cosine, 0.1-epoch warm-up, no weight decay) to 91% with convnet: ours in each
# of PRECS, then PyTorch's on the same recipe, graphed and eager (torch_graphs_tta.py).
adamw_recipe() {  # TAG BATCH LR EPOCHS BETA2 SMOOTHING PRECS
  local tag=$1 batch=$2 lr=$3 epochs=$4 beta2=$5 smooth=$6 precs=$7 prec
  for prec in $precs; do
    goal_train "convnet-tta-$tag-$prec" configs/convnet.toml --set train.epochs=$epochs \
      --set train.batch_size=$batch --set train.optimizer=\"adamw\" --set train.lr=$lr \
      --set train.beta2=$beta2 --set train.label_smoothing=$smooth \
      --set train.schedule=\"cosine\" --set train.warmup_epochs=0.1 --set train.weight_decay=0 \
      --set train.precision=\"$prec\" --set train.target_accuracy=0.91 --set data.resident=\"on\"
  done
  stamp "goal bars: torch_graphs_tta --recipe adamw ($epochs epochs, b$batch, $lr, beta2 $beta2, smoothing $smooth)"
  run_for 120 python3 tests/gpu/torch_graphs_tta.py "$DATA" --models convnet --recipe adamw \
    --batch $batch --lr $lr --recipe-epochs $epochs --beta2 $beta2 --label-smoothing $smooth \
    > "$OUT/goal-torch-tta-$tag.log" 2>&1
  tail -4 "$OUT/goal-torch-tta-$tag.log" | tee -a "$OUT/summary.txt"
}

if has goals; then
  # Issue 7's three goals, ours and PyTorch's bar in this one call (a ratio means something only
  # within one call on one machine): simplecnn at batch 128 against PyTorch's CUDA-graphed step
  # (torch_graphs.py), convnet at batch 1024 in bf16 against torch.compile (torch_anchor.py
  # --variants compile), and the time to 91% with convnet by the short recipe (2 epochs) and by
  # the one-epoch AdamW recipe against PyTorch eager and CUDA-graphed with the same recipe
  # (torch_graphs_tta.py --recipe short, --recipe adamw) and with PyTorch's own (--recipe
  # constant --batches 512 --eager: GPU.md's 2.8 s, graphed and eager).
  goal_train simplecnn-b128 configs/simplecnn.toml --set train.epochs=3 --set train.batch_size=128 \
    --set train.eval=false
  goal_train convnet-b1024-bf16 configs/convnet.toml --set train.epochs=3 --set train.batch_size=1024 \
    --set train.precision=\"bf16\" --set train.eval=false
  goal_train convnet-tta-short configs/convnet.toml --set train.epochs=2 --set train.batch_size=128 \
    --set train.lr=0.1 --set train.momentum=0.9 --set train.schedule=\"cosine\" \
    --set train.warmup_epochs=0.2 --set train.weight_decay=0 --set train.precision=\"tf32\" \
    --set train.target_accuracy=0.91 --set data.resident=\"on\"
  # One epoch to 91% (docs/benchmarks.md, forty-seventh session): AdamW at 5e-3 with beta2 0.95
  # and label smoothing 0.1, batch 128; on the CPU 91.55-91.82% with seeds 0-4 (bf16: 91.46-91.91%
  # with seeds 0-2), the convolutions in bf16 on the 16-bit Tensor Core paths. Half the short
  # recipe's steps; against the goal's 2.8 s / 5 = 0.56 s, and PyTorch on the same recipe.
  adamw_recipe one-ls 128 5e-3 1 0.95 0.1 "tf32 bf16"
  stamp "goal bars: torch_graphs (CUDA-graphed steps)"
  run_for 240 python3 .deps/bench/torch_graphs.py "$DATA" > "$OUT/goal-torch-graphs.log" 2>&1
  grep train_graphed "$OUT/goal-torch-graphs.log" | tee -a "$OUT/summary.txt"
  # cuDNN through PyTorch on each convolution of the two models, forward and backward: against
  # `plexus bench kernels` (goalprofile), whether our cuDNN calls get what PyTorch's do.
  grep '"what": "conv"' "$OUT/goal-torch-graphs.log" | tee -a "$OUT/summary.txt"
  stamp "goal bars: torch.compile convnet b1024 bf16"
  run_for 240 python3 .deps/bench/torch_anchor.py "$DATA" cuda --epochs 3 --batch 1024 \
    --models convnet --variants compile > "$OUT/goal-torch-compile.log" 2>&1
  tail -4 "$OUT/goal-torch-compile.log" | tee -a "$OUT/summary.txt"
  stamp "goal bars: torch_graphs_tta --recipe short"
  run_for 200 python3 tests/gpu/torch_graphs_tta.py "$DATA" --models convnet --recipe short \
    > "$OUT/goal-torch-tta-short.log" 2>&1
  tail -4 "$OUT/goal-torch-tta-short.log" | tee -a "$OUT/summary.txt"
  # The goal's bars as GPU.md has them: PyTorch's own recipe to 91% (SGD with momentum 0.9 at a
  # constant 0.1, batch 512, TF32), CUDA-graphed and eager, in this call: a fifth of the eager
  # time and half of the graphed are what the one-epoch run above must beat.
  stamp "goal bars: torch_graphs_tta --recipe constant --batches 512 --eager"
  run_for 120 python3 tests/gpu/torch_graphs_tta.py "$DATA" --models convnet --recipe constant \
    --batches 512 --eager > "$OUT/goal-torch-tta-b512.log" 2>&1
  tail -2 "$OUT/goal-torch-tta-b512.log" | tee -a "$OUT/summary.txt"
fi

if has recipes; then
  # Other recipes to 91% with convnet, both sides: a second call's work while the machine is
  # warm (PHASES="recipes" LIMIT=250; build-gpu and the tuning cache are still there), since the
  # first call's goals, profiles and ncu fill its time. adamw_recipe (above): ours, then
  # PyTorch's on the same recipe, graphed and eager.
  # The short recipe in bf16 (on the CPU it reached 91.58% after epoch 2 against f32's 91.70%,
  # docs/benchmarks.md, twenty-eighth session).
  goal_train convnet-tta-short-bf16 configs/convnet.toml --set train.epochs=2 --set train.batch_size=128 \
    --set train.lr=0.1 --set train.momentum=0.9 --set train.schedule=\"cosine\" \
    --set train.warmup_epochs=0.2 --set train.weight_decay=0 --set train.precision=\"bf16\" \
    --set train.target_accuracy=0.91 --set data.resident=\"on\"
  # Two epochs at batch 256 and 6e-3: on the CPU 91.96%, 91.62% and 91.16% with seeds 0, 1 and 2
  # (docs/benchmarks.md, fortieth session), in half the short recipe's steps, each twice as large.
  adamw_recipe b256 256 6e-3 2 0.999 0 tf32
fi

if has goalprofile; then
  # Where the two speed goals' steps spend their time, kernel by kernel, and our GEMM tiles
  # against cuBLASLt on the square shapes (the short form of the kernels phase).
  # "nofusion": whole-batch convolution backwards instead of the chunked conv + pool groups
  # (69% of the convnet bf16 step on 2026-11-28); "chunk256": those groups with 256 MiB chunks;
  # "ordinary": every kernel launched the ordinary way, not overlapping the one before it
  # (programmatic_launch = false: what programmatic dependent launch saves a small step).
  # "convnet 128 tf32": the time-to-91% run's step (the short recipe's batch and precision),
  # which no profile has looked at yet (its two epochs trained in 0.93 s on 2026-11-28).
  # "nhwc": f32 (TF32) steps with plugins.options.cuda.f32_channels_last, activations NHWC as in
  # 16 bits (cuDNN's NHWC kernels, the TF32 igemm's 16-byte gathers; forty-second session):
  # against their NCHW lines above, whether the option should be the default.
  # "parts": simplecnn with plugins.options.cuda.step_fusion=false, its step as the parts' fused
  # groups instead of the whole-step kernel (ops/step_cnn.cu, forty-sixth session): what it saves.
  for model_batch_prec in 'simplecnn 128 f32' 'simplecnn 128 f32 parts' 'simplecnn 128 f32 ordinary' 'convnet 1024 bf16' \
                          'convnet 128 tf32' 'convnet 1024 bf16 nofusion' 'convnet 1024 bf16 chunk256' \
                          'simplecnn 128 f32 nhwc' 'convnet 128 tf32 nhwc'; do
    set -- $model_batch_prec
    tag="$1-b$2-$3-profile${4:+-$4}"
    extra=()
    [[ ${4:-} == nofusion ]] && extra=(--set train.fusion=false)
    [[ ${4:-} == chunk256 ]] && extra=(--set plugins.options.cuda.fuse_chunk_bytes=268435456)
    # simplecnn: the fused groups' timings as a whole (the thirty-first session's direct backward
    # of conv2 against the chunked cuDNN group), from a fresh tuning.
    [[ $1 == simplecnn ]] && extra=(--log-level debug --set backend.tune_cache=\"off\")
    [[ ${4:-} == ordinary ]] && extra+=(--set plugins.options.cuda.programmatic_launch=false)
    [[ ${4:-} == parts ]] && extra+=(--set plugins.options.cuda.step_fusion=false)
    [[ ${4:-} == nhwc ]] && extra+=(--set plugins.options.cuda.f32_channels_last=true)
    bench_step "$tag" 120 $1 $2 $3 "${extra[@]}"
  done
  # Every candidate (our tiles, cuDNN, cuBLASLt) on each problem of the convnet bf16 step at
  # batch 1024, the whole batch as the tuner times it: which side each convolution backward
  # should be on, and by how much.
  tag=convnet-b1024-bf16
  stamp "plexus bench kernels: the $tag training step"
  # (--log-level debug: each cudnn_graph kernel's engines, timed, and the one it kept.)
  run_unstuck "$OUT/bench-kernels-$tag.log" 150 $B/bin/plexus bench kernels configs/convnet.toml \
    --backend cuda --set train.batch_size=1024 --set train.precision=\"bf16\" \
    --set data.path=\"$DATA\" "${TIMEOUTS[@]}" --log-level debug \
    --json "$OUT/bench-kernels-$tag.json"
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -E '^[a-z]|fastest' "$OUT/bench-kernels-$tag.log" | tee -a "$OUT/summary.txt"
  grep -E 'on the graph API|graph API failed|cuda.conv\] conv2d.*(ms, workspace|no plan|skipped)' \
    "$OUT/bench-kernels-$tag.log" | sort | uniq -c | sort -rn | head -60 | tee -a "$OUT/summary.txt"
  stamp "plexus bench kernels: GEMMs in bf16"
  run_unstuck "$OUT/bench-kernels-gemm-bf16.log" 150 $B/bin/plexus bench kernels --backend cuda \
    --no-step --dtype bf16 --gemm 1024,4096,8192,128x10x800,128x256x6272,1024x256x6272 \
    "${TIMEOUTS[@]}" \
    --json "$OUT/bench-kernels-gemm-bf16.json"
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -E '^gemm|GFLOP' "$OUT/bench-kernels-gemm-bf16.log" | tee -a "$OUT/summary.txt"
fi

if has ncu; then
  # Why our convolutions run at 24-58 TFLOP/s where cuDNN's forward reaches 254 (2026-11-28):
  # Nsight Compute on the first launches of our igemm, direct and pool kernels in one convnet
  # bf16 b1024 step (speed of light, memory, warp stalls, occupancy, launch), after the
  # goalprofile phase has filled the tuning and cuDNN caches (so no candidate is timed here).
  if command -v ncu > /dev/null; then
    stamp "ncu: convnet b1024 bf16 step, igemm/direct/pool kernels"
    run_for 200 ncu --clock-control none --target-processes all \
      --kernel-name regex:'igemm|direct_|max_pool|chunk_accumulate|column_sum|channel_sum' \
      --launch-count 14 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats --section SchedulerStats --section InstructionStats \
      --section MemoryWorkloadAnalysis_Tables \
      $B/bin/plexus bench step configs/convnet.toml --backend cuda --set train.batch_size=1024 \
      --set train.precision=\"bf16\" --set data.path=\"$DATA\" --steps 1 --warmup 0 "${PDL_OFF[@]}" \
      > "$OUT/ncu-convnet-b1024-bf16.log" 2>&1
    echo "exit $?" | tee -a "$OUT/summary.txt"
    # Executed instructions and IPC against docs/kernels.md's static counts (the staged
    # epilogues' model: a kernel's time is its warps' instructions at about 2 a cycle an SM),
    # and the L1 and L2 hit rates (the gathered activations go through L1 since the forty-third
    # session: docs/kernels.md, "Gathered activations through L1"), and the shared-memory bank
    # conflicts (the emulator's PLEXUS_EMU_ACCESS says one wavefront a request for every ldmatrix
    # and 16-byte copy since the forty-ninth session: "Shared-memory wavefronts of the copies").
    grep -E '^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Executed Instructions  |Executed Ipc Active|Issue Slots Busy|L1/TEX Hit Rate|L2 Hit Rate|[Bb]ank' \
      "$OUT/ncu-convnet-b1024-bf16.log" | head -200 | tee -a "$OUT/summary.txt"
  else
    echo "no ncu on this machine" | tee -a "$OUT/summary.txt"
  fi
fi

if has ncugemm; then
  # Why our Hopper GEMM tiles reach what they reach at 8192 in bf16 against cuBLASLt (the 90%
  # goal): Nsight Compute on one launch of each persistent, clustered and ping-pong tile and of
  # cuBLASLt's kernel, each in a `plexus bench kernels` run of its own (a launch past the
  # warm-up): Tensor Core and L2 throughput, stalls, occupancy. About 15 s a kernel.
  if command -v ncu > /dev/null; then
    for pick in 'TileN128P,' 'TileN256P,' 'TileN256C2,' 'TileN128PP,' 'TileN128PPC2,' \
                'nvjet|xmma|cutlass'; do
      tag=$(echo "$pick" | tr -dc 'A-Za-z0-9')
      stamp "ncu: bf16 GEMM 8192, $pick"
      run_for 60 ncu --clock-control none --kernel-name-base demangled \
        --kernel-name regex:"$pick" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        $B/bin/plexus bench kernels --backend cuda --no-step --dtype bf16 --gemm 8192 \
        --budget-ms 20 "${TIMEOUTS[@]}" > "$OUT/ncu-gemm8192-$tag.log" 2>&1
      echo "exit $?" | tee -a "$OUT/summary.txt"
      grep -E '^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Executed Ipc Active|Issue Slots Busy|L2 Hit Rate|Cluster Size|Stall' \
        "$OUT/ncu-gemm8192-$tag.log" | head -40 | tee -a "$OUT/summary.txt"
    done
  else
    echo "no ncu on this machine" | tee -a "$OUT/summary.txt"
  fi
fi

if has racecheck; then
  # The kernels with a last-block counter, under racecheck (shared memory hazards) one by one.
  for t in "every cuda tensor core gemm candidate matches the cpu" \
           "the classifier head fused on cuda matches the cpu" \
           "a fused cuda f16 step unscales and checks its gradients in one kernel"; do
    stamp "racecheck: $t"
    log="$OUT/racecheck-$(echo "$t" | tr -c 'a-z0-9\n' - | cut -c1-40).log"
    run_for 120 compute-sanitizer --tool racecheck --error-exitcode 9 $B/bin/plexus_tests "$t" \
      > "$log" 2>&1
    echo "exit $?" | tee -a "$OUT/summary.txt"
    grep -E 'RACECHECK SUMMARY|hazard|test cases' "$log" | head -8 | tee -a "$OUT/summary.txt"
  done
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    stamp "compute-sanitizer $tool"
    run_for 400 compute-sanitizer --tool $tool --error-exitcode 9 $B/bin/plexus_tests "[cuda]" \
      > "$OUT/sanitizer-$tool.log" 2>&1
    echo "exit $?" | tee -a "$OUT/summary.txt"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard' "$OUT/sanitizer-$tool.log" | head -20 | tee -a "$OUT/summary.txt"
  done
fi

if has compare; then
  # cuda against the cpu: every op of the built-in suite (forward and backward), a convnet step
  # and 200 training steps; the table, JSON, CSV and chart come back.
  stamp "plexus compare cpu vs cuda"
  run_for 500 $B/bin/plexus compare configs/convnet.toml --b cuda --steps 200 \
    --set plugins.options.cuda.tf32=false \
    --set data.path=\"$DATA\" --json "$OUT/compare.json" --csv "$OUT/compare.csv" \
    --plot "$OUT/compare.png" > "$OUT/compare.log" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -vE ' pass ' "$OUT/compare.log" | tail -40 | tee -a "$OUT/summary.txt"
fi

if has kernels; then
  # Issue 7: our Tensor Core kernels against cuBLAS and cuDNN, candidate by candidate, on the
  # square GEMMs and on every problem of the two models' training steps; then training with each
  # side forced and with the tuner (its choices in the manifest's kernel_choice).
  for dtype in bf16 f16; do
    stamp "plexus bench kernels: GEMMs in $dtype"
    run_for 400 $B/bin/plexus bench kernels --backend cuda --no-step --dtype $dtype \
      --gemm 1024,2048,4096,8192,128x10x800,128x256x6272,1024x256x6272,1024x10x256 \
      --json "$OUT/bench-kernels-gemm-$dtype.json" > "$OUT/bench-kernels-gemm-$dtype.log" 2>&1
    echo "exit $?" | tee -a "$OUT/summary.txt"
    grep -E '^gemm|GFLOP' "$OUT/bench-kernels-gemm-$dtype.log" | tee -a "$OUT/summary.txt"
  done
  stamp "plexus bench kernels: GEMMs in tf32"
  run_for 300 $B/bin/plexus bench kernels --backend cuda --no-step --dtype f32 \
    --set train.precision=\"tf32\" --gemm 1024,4096,8192 \
    > "$OUT/bench-kernels-gemm-tf32.log" 2>&1
  grep -E '^gemm|GFLOP' "$OUT/bench-kernels-gemm-tf32.log" | tee -a "$OUT/summary.txt"
  for model in simplecnn convnet; do
    for batch in 128 1024; do
      tag="$model-b$batch-bf16"
      stamp "plexus bench kernels: the $tag training step"
      run_for 300 $B/bin/plexus bench kernels configs/$model.toml --backend cuda \
        --set train.batch_size=$batch --set train.precision=\"bf16\" --set data.path=\"$DATA\" \
        --json "$OUT/bench-kernels-$tag.json" > "$OUT/bench-kernels-$tag.log" 2>&1
      echo "exit $?" | tee -a "$OUT/summary.txt"
      grep -E '^[a-z]|fastest' "$OUT/bench-kernels-$tag.log" | tee -a "$OUT/summary.txt"
    done
  done
  # Where each goal's step spends its time (issue 7: the gap, kernel by kernel).
  for model_batch_prec in 'simplecnn 128 f32' 'simplecnn 128 bf16' 'simplecnn 128 f16' 'convnet 1024 bf16' \
                          'convnet 128 tf32' 'simplecnn 128 f32 conv-bias' \
                          'convnet 1024 bf16 no-bias-act' 'convnet 128 tf32 no-bias-act' \
                          'convnet 1024 f16' 'convnet 1024 f16 no-bias-act' \
                          'convnet 1024 bf16 native' 'simplecnn 128 bf16 native' \
                          'simplecnn 128 f32 native' 'convnet 128 f32 native'; do
    set -- $model_batch_prec
    tag="$1-b$2-$3-profile${4:+-$4}"
    # "conv-bias": the conv's bias added by the convolution, not the pool (pool_bias, the
    # seventeenth session's fusion), to time the two. "no-bias-act": the conv's bias written
    # first and conv -> relu as a chain instead of cuDNN's fused call (conv_bias_activation, the
    # eighteenth session's).
    extra=()
    [[ ${4:-} == conv-bias ]] && extra=(--set plugins.options.cuda.pool_bias=false)
    [[ ${4:-} == no-bias-act ]] && extra=(--set plugins.options.cuda.conv_bias_activation=false)
    # "native": the plugin's own kernels, the first layer on the direct kernels (the
    # twenty-first session's), its backward as one relu_backward+sum+conv2d_backward_weight; in
    # f32 (TF32: the configs' tf32 option) the other convolutions on the TF32 igemm kernels and
    # the classifier's weight gradient on simt_16x16 (the twenty-third session's).
    [[ ${4:-} == native ]] && extra=(--set backend.kernels=\"native\")
    bench_step "$tag" 300 $1 $2 $3 "${extra[@]}"
  done
  # The layout planner (the nineteenth session's): a chain of convolutions with
  # train.channels_last on and off, on both kernel sides.
  for cl_side in 'true library' 'false library' 'true native' 'false native'; do
    set -- $cl_side
    tag="convchain-b512-bf16-channels-last-$1-$2"
    bench_step "$tag" 300 convnet 512 bf16 --set model.file=\"$PWD/tests/gpu/convchain.toml\" \
      --set train.channels_last=$1 --set backend.kernels=\"$2\"
  done
  # Through the pools (the twentieth session's NHWC max-pool): convnet b1024 and simplecnn b128
  # in bf16 with train.channels_last off against on (the default), library side.
  for model_batch_cl in 'convnet 1024 false' 'convnet 1024 true' 'simplecnn 128 false' \
                        'simplecnn 128 true'; do
    set -- $model_batch_cl
    tag="$1-b$2-bf16-channels-last-$3"
    bench_step "$tag" 300 $1 $2 bf16 --set train.channels_last=$3
  done
  for side in library native auto; do
    tag="convnet-b1024-bf16-kernels-$side"
    stamp "plexus train $tag"
    run_for 600 $B/bin/plexus train configs/convnet.toml --set backend.name=cuda --set train.epochs=$EPOCHS \
      --set train.batch_size=1024 --set train.precision=\"bf16\" --set backend.kernels=\"$side\" \
      --set backend.tune_cache=\"$OUT/kernels.tsv\" --set data.path=\"$DATA\" \
      --set logging.progress=plain --set output.dir=\"$OUT/runs/$tag\" > "$OUT/train-$tag.log" 2>&1
    echo "exit $?" | tee -a "$OUT/summary.txt"
    tail -3 "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
  done
  cp -f "$OUT/kernels.tsv" "$OUT/kernels-tuned.tsv" 2> /dev/null
fi

if has train; then
  for model in simplecnn convnet; do
    for batch in 128 1024; do
      for capture in true false; do
        tag="$model-b$batch-capture-$capture"
        stamp "plexus train $tag"
        run_for 600 $B/bin/plexus train configs/$model.toml --set backend.name=cuda \
          --set train.epochs=$EPOCHS --set train.batch_size=$batch \
          --set train.graph_capture=$capture --set data.path=\"$DATA\" \
          --set logging.progress=plain --set output.dir=\"$OUT/runs/$tag\" \
          > "$OUT/train-$tag.log" 2>&1
        echo "exit $?" | tee -a "$OUT/summary.txt"
        tail -4 "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
      done
    done
  done
fi

if has train; then
  # Mixed precision (issue 7): each precision on CUDA, and the CPU reference, test accuracy and
  # images/s from the summary lines; the manifest says whether TF32 was turned on.
  for model in simplecnn convnet; do
    for precision in f32 tf32 bf16 f16; do
      tag="$model-$precision"
      stamp "plexus train $tag"
      # The shipped configs turn the plugin's TF32 on: off here, so f32 is f32 and only
      # train.precision = "tf32" turns it on.
      run_for 600 $B/bin/plexus train configs/$model.toml --set backend.name=cuda --set plugins.options.cuda.tf32=false \
        --set train.epochs=$EPOCHS --set train.precision=\"$precision\" --set data.path=\"$DATA\" \
        --set logging.progress=plain --set output.dir=\"$OUT/runs/$tag\" \
        > "$OUT/train-$tag.log" 2>&1
      echo "exit $?" | tee -a "$OUT/summary.txt"
      tail -4 "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
      grep -A5 '"precision"' "$OUT/runs/$tag/manifest.json" | tr -d ' \n' | tee -a "$OUT/summary.txt"
      echo | tee -a "$OUT/summary.txt"
    done
  done
  stamp "plexus_tests [precision]"
  run_for 600 $B/bin/plexus_tests "[precision]" > "$OUT/tests-precision.log" 2>&1
  tail -3 "$OUT/tests-precision.log" | tee -a "$OUT/summary.txt"
fi

if has train; then
  # Memory (issue 7): the peak of a convnet step at batch 1024 in f32 against PyTorch's 741 MiB,
  # with train.recompute off and on; the plan's live peak and what is live there. And
  # resnet: batch norms recomputed from their saved statistics (batch_norm_apply on CUDA).
  for model_rec in 'convnet []' 'convnet ["relu","gelu","max_pool2d","avg_pool2d","cast","add","mul"]' \
                   'resnet []' 'resnet ["batch_norm","relu","add"]'; do
    model=${model_rec%% *} rec=${model_rec#* }
    for precision in f32 bf16; do
      tag="$model-b1024-$precision-memory-$( [ "$rec" = '[]' ] && echo plain || echo recompute )"
      stamp "plexus train $tag"
      run_for 600 $B/bin/plexus train configs/$model.toml --set backend.name=cuda --set train.batch_size=1024 \
        --set train.max_steps=3 --set train.eval=false --set train.precision=\"$precision\" \
        --set "train.recompute=$rec" --set data.path=\"$DATA\" --set logging.progress=plain \
        --set output.dir=\"$OUT/runs/$tag\" > "$OUT/train-$tag.log" 2>&1
      echo "exit $?" | tee -a "$OUT/summary.txt"
      grep '^memory' "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
      run_for 600 python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['memory_plan']; print({k: v for k, v in p.items() if k != 'peak_live'}); [print('   ', x['bytes'] >> 20, 'MiB', x['value']) for x in p['peak_live'][:6]]" \
        "$OUT/runs/$tag/manifest.json" 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
fi

if has tta; then
  # Time to accuracy (issue 7), measured as ../shared/bench/torch_mem_tta.py measures PyTorch's:
  # the same batches and rates, SGD with momentum 0.9, a constant rate, no weight decay, TF32,
  # the data on the device, training time without evaluation until the test accuracy reaches
  # 88% (simplecnn) or 91% (convnet), at most 15 epochs; then the script itself, and PyTorch's
  # CUDA-graphed step to the same targets (tests/gpu/torch_graphs_tta.py), same call.
  for model_target in 'simplecnn 0.88' 'convnet 0.91'; do
    model=${model_target% *} target=${model_target#* }
    for batch_lr in '128 0.05' '256 0.05' '512 0.1'; do
      batch=${batch_lr% *} lr=${batch_lr#* }
      tag="$model-tta-b$batch"
      stamp "plexus train $tag"
      run_for 600 $B/bin/plexus train configs/$model.toml --set backend.name=cuda --set train.epochs=15 \
        --set train.batch_size=$batch --set train.lr=$lr --set train.momentum=0.9 \
        --set train.schedule=\"constant\" --set train.weight_decay=0 --set train.precision=\"tf32\" \
        --set train.target_accuracy=$target --set data.resident=\"on\" --set data.path=\"$DATA\" \
        --set logging.progress=plain --set output.dir=\"$OUT/runs/$tag\" > "$OUT/train-$tag.log" 2>&1
      echo "exit $?" | tee -a "$OUT/summary.txt"
      grep -h '"type":"target"' "$OUT/runs/$tag/metrics.jsonl" | tee -a "$OUT/summary.txt"
      grep -h 'target test accuracy' "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
    done
  done
  # The shortest recipe found to 91% on convnet (docs/benchmarks.md, twelfth session: 2 epochs,
  # a cosine decay from 0.1 after a 0.2-epoch warm-up), ours and then PyTorch's, eager and
  # CUDA-graphed, with the same recipe (torch_graphs_tta.py --recipe short).
  tag="convnet-tta-short"
  stamp "plexus train $tag"
  run_for 600 $B/bin/plexus train configs/convnet.toml --set backend.name=cuda --set train.epochs=2 \
    --set train.batch_size=128 --set train.lr=0.1 --set train.momentum=0.9 \
    --set train.schedule=\"cosine\" --set train.warmup_epochs=0.2 --set train.weight_decay=0 \
    --set train.precision=\"tf32\" --set train.target_accuracy=0.91 --set data.resident=\"on\" \
    --set data.path=\"$DATA\" --set logging.progress=plain --set output.dir=\"$OUT/runs/$tag\" \
    > "$OUT/train-$tag.log" 2>&1
  echo "exit $?" | tee -a "$OUT/summary.txt"
  grep -h 'target test accuracy' "$OUT/train-$tag.log" | tee -a "$OUT/summary.txt"
  stamp torch_graphs_tta_short
  run_for 600 python3 tests/gpu/torch_graphs_tta.py "$DATA" --models convnet --recipe short \
    > "$OUT/torch-graphs-tta-short.log" 2>&1
  tail -4 "$OUT/torch-graphs-tta-short.log" | tee -a "$OUT/summary.txt"
  stamp torch_mem_tta
  run_for 600 python3 .deps/bench/torch_mem_tta.py "$DATA" > "$OUT/torch-mem-tta.log" 2>&1
  tail -20 "$OUT/torch-mem-tta.log" | tee -a "$OUT/summary.txt"
  # PyTorch's CUDA-graphed step to the same targets (the issue's second bar).
  stamp torch_graphs_tta
  run_for 600 python3 tests/gpu/torch_graphs_tta.py "$DATA" > "$OUT/torch-graphs-tta.log" 2>&1
  tail -8 "$OUT/torch-graphs-tta.log" | tee -a "$OUT/summary.txt"
fi

if has torch; then
  for batch in 128 1024; do
    stamp "torch_anchor batch $batch"
    run_for 600 python3 .deps/bench/torch_anchor.py "$DATA" cuda --epochs $EPOCHS --batch $batch \
      --variants fp32,tf32,bf16 > "$OUT/torch-anchor-b$batch.log" 2>&1
    tail -8 "$OUT/torch-anchor-b$batch.log" | tee -a "$OUT/summary.txt"
  done
  stamp torch_graphs
  run_for 600 python3 .deps/bench/torch_graphs.py "$DATA" > "$OUT/torch-graphs.log" 2>&1
  tail -20 "$OUT/torch-graphs.log" | tee -a "$OUT/summary.txt"
fi
stamp done
