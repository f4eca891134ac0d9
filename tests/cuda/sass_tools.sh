# Sourced by the SASS checks (sass_check_*.sh): finds cuobjdump and the nvdisasm its --dump-sass
# runs, as $cuobjdump and $nvdisasm (nvdisasm's folder put on PATH), or exits 77 (skipped)
# saying which is missing. cuobjdump is taken from $CUOBJDUMP, PATH, the CUDA toolkit's bin
# directory or the pip package nvidia-cuda-cuobjdump; nvdisasm from $NVDISASM_PATH, PATH, the
# toolkit or the pip package nvidia-cuda-nvdisasm.

# A tool: the first executable among the candidates, then the pip packages' copies.
find_tool() {
  local name=$1
  shift
  local c
  for c in "$@" "$(command -v "$name" || true)" "/usr/local/cuda/bin/$name"; do
    if [[ -n "$c" && -x "$c" ]]; then echo "$c"; return 0; fi
  done
  command -v python3 > /dev/null || return 0
  python3 - "$name" << 'PY' 2> /dev/null || true
import glob, os, site, sys
name = sys.argv[1]
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "*", "bin", name))):
        if os.access(p, os.X_OK):
            print(p)
            sys.exit(0)
PY
}

cuobjdump=$(find_tool cuobjdump "${CUOBJDUMP:-}")
if [[ -z "$cuobjdump" ]]; then
  echo "skipped: no cuobjdump (the CUDA toolkit's, or: pip install nvidia-cuda-cuobjdump)"
  exit 77
fi
nvdisasm=$(find_tool nvdisasm "${NVDISASM_PATH:+$NVDISASM_PATH/nvdisasm}" "$(dirname "$cuobjdump")/nvdisasm")
if [[ -z "$nvdisasm" ]]; then
  echo "skipped: no nvdisasm, which cuobjdump --dump-sass runs (pip install nvidia-cuda-nvdisasm)"
  exit 77
fi
export PATH="$(dirname "$nvdisasm"):$PATH"

# The plugin file's SASS, every architecture, at path OUT (a missing plugin fails the check).
# The dump takes about 45 s and 600 MB for the whole plugin, and five checks read it: with
# $SASS_CACHE_DIR set (the ctests set it) it is made once per build of the plugin, under a lock
# so that checks run in parallel wait for one dump, and OUT links to it.
dump_sass() {
  local so=$1 out=$2
  [[ -f "$so" ]] || { echo "FAIL: no plugin file $so"; exit 1; }
  if [[ -z "${SASS_CACHE_DIR:-}" ]] || ! command -v flock > /dev/null; then
    "$cuobjdump" --dump-sass "$so" > "$out" || { echo "FAIL: cuobjdump --dump-sass $so"; exit 1; }
    return 0
  fi
  mkdir -p "$SASS_CACHE_DIR"
  local cache
  cache="$SASS_CACHE_DIR/$(basename "$so").sass"
  (
    flock 9
    if [[ ! -s "$cache" || "$so" -nt "$cache" ]]; then
      "$cuobjdump" --dump-sass "$so" > "$cache.part" && mv -f "$cache.part" "$cache"
    fi
  ) 9> "$cache.lock" || { echo "FAIL: cuobjdump --dump-sass $so"; exit 1; }
  ln -sf "$cache" "$out"
}

# A mangled name demangled (as it is where c++filt is missing).
demangle() {
  echo "$1" | c++filt 2> /dev/null || echo "$1"
}

# A demangled kernel name without the return type (a template's void), the plugin's namespaces
# and the parameter list.
short_kernel_name() {
  echo "${1#void }" | sed -e 's/plexus::cuda:://g' -e 's/(anonymous namespace):://g' -e 's/(.*$//'
}

# The same from the mangled name.
kernel_name() {
  short_kernel_name "$(demangle "$1")"
}
