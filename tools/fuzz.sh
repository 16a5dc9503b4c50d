#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz: the config, manifest, safetensors and token-file readers) in
# build-fuzz with clang and runs each for SECONDS (default 60) over a temporary copy of its corpus, so the
# repository is never modified. Exits non-zero on any crash,
# leak, timeout or out-of-memory and prints the reproducer's path. Usage: tools/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DZERO3_FUZZ=ON -DZERO3_ENABLE_CUDA=OFF -DZERO3_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build build-fuzz --target fuzz_config fuzz_manifest fuzz_safetensors fuzz_token_file

work=$(mktemp -d "${TMPDIR:-/tmp}/zero3-fuzz.XXXXXX")
echo "fuzz: working in $work (kept when a target fails)"
failed=0
run_target() {  # name corpus-dir [extra libFuzzer flags...]
  local name=$1 corpus=$2
  shift 2
  mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
  cp "$corpus"/* "$work/$name/corpus/"
  if ! build-fuzz/bin/"$name" "$work/$name/corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$work/$name/artifacts/" "$@" \
    >"$work/$name/log" 2>&1; then
    tail -n 60 "$work/$name/log"
    for f in "$work/$name/artifacts"/*; do
      [ -e "$f" ] && echo "fuzz: $name FAILED; reproducer: $f (rerun: build-fuzz/bin/$name $f)"
    done
    failed=1
  else
    grep -E "^#[0-9]+[[:space:]]+DONE|stat::average_exec_per_sec" "$work/$name/log" | sed "s/^/fuzz: $name: /"
  fi
}
run_target fuzz_config tests/fuzz/corpus/config -dict=tests/fuzz/config.dict
run_target fuzz_manifest tests/fuzz/corpus/manifest
run_target fuzz_safetensors tests/fuzz/corpus/safetensors
run_target fuzz_token_file tests/fuzz/corpus/token_file
if [ "$failed" -ne 0 ]; then
  echo "fuzz: FAILED (logs and reproducers under $work)"
  exit 1
fi
rm -rf "$work"
echo "fuzz: every target ran ${seconds} s without a crash, leak, timeout or out-of-memory"
