#!/usr/bin/env bash
# Formatting check (fast, run by CI) and, with --tidy, clang-tidy over the project's sources using the
# default preset's compile_commands.json (slow: minutes on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t sources < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
clang-format --dry-run -Werror "${sources[@]}"
echo "lint: clang-format clean (${#sources[@]} files)"
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
