#!/usr/bin/env bash
# Packs pstrain for a host that has the NVIDIA driver and CUDA libraries but
# none of our Debian packages (a GPU machine with only CUDA and PyTorch, say):
# the binaries, the CUDA module, and every shared library `ldd` names except
# glibc's own and CUDA's (cudart, cuBLAS, cuDNN, NCCL), which that host has.
#
#   bash scripts/bundle.sh OUT.tar.xz [build_dir] [extra binaries...]   (or OUT.tar.gz)
#
# The archive unpacks into pstrain-bundle/: bin/ (pstrain, libpstrain_cuda.so,
# the extra binaries), lib/ and env.sh, which puts lib/ and the host's CUDA
# libraries (found under /usr/local/cuda and Python's nvidia-* wheels) on
# LD_LIBRARY_PATH:  tar xJf OUT.tar.xz && . pstrain-bundle/env.sh && pstrain version
set -euo pipefail
out=${1:?usage: bash scripts/bundle.sh OUT.tar.xz [build_dir] [extra binaries...]}
build=${2:-build}
shift $(($# < 2 ? $# : 2))
[[ -x $build/pstrain ]] || { echo "bundle: $build/pstrain not found; build first" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/pstrain-bundle
mkdir -p "$root/bin" "$root/lib"
bins=("$build/pstrain" "$@")
cp "${bins[@]}" "$root/bin/"
# The CUDA module is dlopen'ed (ldd does not name it). A build without CUDA
# makes a bundle for CPUs only: say so, loudly.
if [[ -f $build/libpstrain_cuda.so ]]; then
  cp "$build/libpstrain_cuda.so" "$root/bin/"
else
  echo "bundle: WARNING: $build/libpstrain_cuda.so not found (a build with CUDA makes it):" \
    "this bundle runs on CPUs only" >&2
fi

# glibc's libraries and the dynamic loader come from the host; so do CUDA's.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libresolv\.|libutil\.|libcuda\.|libcudart\.|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
# A library ldd cannot find here would be missing there too.
for f in "$root"/bin/*; do
  missing=$(ldd "$f" 2>/dev/null | awk '/not found/ { print $1 }' | grep -vE "$skip" || true)
  [[ -z $missing ]] || { echo "bundle: $f needs libraries not found here: $missing" >&2; exit 1; }
done
for f in "$root"/bin/*; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$root/lib/$name"
done

cat >"$root/env.sh" <<'EOF'
# Source me: puts the bundle's binaries and libraries, and the host's CUDA
# libraries, on PATH and LD_LIBRARY_PATH.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_cuda=""
for _lib in libcudart.so.13 libcublas.so.13 libcudnn.so.9; do
  _p=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/lib /opt /usr/lib \
         -name "$_lib" 2>/dev/null | head -1)
  [[ -n $_p ]] && _cuda="$_cuda:$(dirname "$_p")"
done
export PATH="$_b/bin:$PATH"
export LD_LIBRARY_PATH="$_b/lib$_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _b _cuda _lib _p
EOF
# The suffix picks the compression (.tar.xz smallest, .tar.gz fastest).
mkdir -p "$(dirname "$out")"
tar -C "$stage" -caf "$out" pstrain-bundle
echo "bundle: $out ($(du -h "$out" | cut -f1)): $(ls "$root/bin" | tr '\n' ' ')"
