#!/usr/bin/env bash
# Makes DIR a Python virtual environment with ONNX Runtime and the onnx package
# (from pip), in which the ONNX export tests run the exported models:
#
#   bash scripts/onnx_python_env.sh build/onnx-venv
#   build/onnx-venv/bin/python -c 'import onnxruntime'
#
# Idempotent: a DIR that is ready (DIR/ready) is left as it is. Needs Debian's
# python3 and python3-venv (scripts/install-deps.sh) and a reachable package
# index. When the environment cannot be made (no index, no venv module), it
# writes the reason to DIR.unavailable, removes the half-made DIR and exits 0:
# the tests then skip, naming that reason. PSTRAIN_PYTHON picks the
# interpreter (default /usr/bin/python3, else python3 on PATH).
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
reason_file="$dir.unavailable"
packages=("onnxruntime>=1.16" "onnx>=1.14" "numpy")

if [[ -f "$dir/ready" ]] && "$dir/bin/python" -c 'import onnxruntime, onnx, numpy' 2>/dev/null; then
  echo "onnx_python_env: $dir is ready"
  exit 0
fi
rm -f "$reason_file"

python=${PSTRAIN_PYTHON:-/usr/bin/python3}
if [[ ! -x "$python" ]]; then python=$(command -v python3 || true); fi

unavailable() {
  echo "onnx_python_env: $1" >&2
  printf '%s\n' "$1" >"$reason_file"
  rm -rf "$dir"
  exit 0
}

[[ -n "$python" ]] || unavailable "no python3 (install Debian's python3: scripts/install-deps.sh)"
rm -rf "$dir"
if ! out=$("$python" -m venv "$dir" 2>&1); then
  unavailable "$python -m venv $dir failed (install Debian's python3-venv: scripts/install-deps.sh): $(tail -n 3 <<<"$out" | tr '\n' ' ')"
fi
echo "onnx_python_env: pip install ${packages[*]} into $dir"
if ! out=$("$dir/bin/python" -m pip install --disable-pip-version-check --no-input --quiet \
    --retries 2 --timeout 30 "${packages[@]}" 2>&1); then
  unavailable "pip could not install ${packages[*]} (no package index reachable?): $(tail -n 3 <<<"$out" | tr '\n' ' ')"
fi
if ! out=$("$dir/bin/python" -c 'import onnxruntime, onnx, numpy; print(onnxruntime.__version__, onnx.__version__, numpy.__version__)' 2>&1); then
  unavailable "onnxruntime, onnx or numpy do not import after pip install: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
fi
echo "onnx_python_env: onnxruntime, onnx, numpy: $out"
touch "$dir/ready"
