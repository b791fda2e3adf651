#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format (.clang-format,
# Google style, 100 columns) makes of it. Fix with: clang-format -i FILE...
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed" >&2; exit 1; }
bad=()
while IFS= read -r -d '' f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files -z '*.cc' '*.h' '*.cu' '*.cuh')
if [[ ${#bad[@]} -gt 0 ]]; then
  echo "check-format: ${#bad[@]} file(s) need clang-format -i: ${bad[*]}" >&2
  exit 1
fi
echo "check-format: all files formatted"
