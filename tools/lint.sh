#!/usr/bin/env bash
# Formatting and layer checks (fast, run by CI: tools/check-layers.py); --function-size: no function of the library (runtime/, offload/,
# kernels/) over 120 lines, clang-tidy's readability-function-size alone (CI; a few minutes on two cores);
# --tidy: every clang-tidy check of .clang-tidy over the project's sources (slow). Both use the default
# preset's compile_commands.json.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t sources < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
clang-format --dry-run -Werror "${sources[@]}"
echo "lint: clang-format clean (${#sources[@]} files)"
python3 tools/check-layers.py   # include paths stay in their folders; environment variables declared once
if [ "${1:-}" = "--function-size" ]; then
  [ -f build/compile_commands.json ] || cmake --preset default >/dev/null
  mapfile -t units < <(git ls-files 'runtime/*.cpp' 'offload/*.cpp' 'kernels/*.cpp')
  config='{Checks: "-*,readability-function-size", CheckOptions: [{key: readability-function-size.LineThreshold, value: 120}]}'
  jobs=$(nproc)
  out=$(printf '%s\n' "${units[@]}" | xargs -P "$jobs" -n 4 clang-tidy -p build --quiet --config="$config" \
    --extra-arg=-Wno-unknown-warning-option 2>/dev/null | grep -E "warning:|error:" || true)
  if [ -n "$out" ]; then
    echo "$out"
    echo "lint: functions over 120 lines in the library (split them)"
    exit 1
  fi
  echo "lint: no library function over 120 lines (${#units[@]} translation units)"
fi
if [ "${1:-}" = "--tidy" ]; then
  [ -f build/compile_commands.json ] || cmake --preset default >/dev/null
  mapfile -t units < <(git ls-files '*.cpp' | grep -v '^tests/')
  # GCC-only flags in compile_commands.json (-Wno-error=restrict) are not clang diagnostics.
  out=$(clang-tidy -p build --quiet --extra-arg=-Wno-unknown-warning-option "${units[@]}" 2>/dev/null | grep -E "warning:|error:" || true)
  if [ -n "$out" ]; then
    echo "$out"
    exit 1
  fi
  echo "lint: clang-tidy clean (${#units[@]} translation units)"
fi
