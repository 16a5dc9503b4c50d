#!/usr/bin/env bash
# The two programs' command sets and versions: `zero3` has no benchmarks (`zero3 bench` is an unknown
# command), `zero3-bench` offers every benchmark; both print the project's version (--version, and `zero3
# info` first); `zero3-bench train` names a zero3 program it cannot run instead of starting anything, and
# `zero3-bench attention` runs and names a torch Python or script it cannot run.
# Usage: programs_test.sh ZERO3_BINARY ZERO3_BENCH_BINARY PROJECT_VERSION
set -u
zero3="$1"
bench="$2"
version="$3"
source "$(dirname "$0")/../support/checks.sh"

out="$("$zero3" --version 2>&1)"
[ "$out" = "zero3 $version" ] || fail "zero3 --version printed '$out', expected 'zero3 $version'"
out="$("$bench" --version 2>&1)"
[ "$out" = "zero3-bench $version" ] || fail "zero3-bench --version printed '$out', expected 'zero3-bench $version'"
out="$("$zero3" info 2>&1 | head -n 1)"
[ "$out" = "zero3 $version" ] || fail "zero3 info begins '$out', expected 'zero3 $version'"

if out="$("$zero3" bench engine --json 2>&1)"; then
  fail "zero3 bench engine ran (exit 0): the benchmarks belong to zero3-bench"
fi
for cmd in train engine offload cpu-optimizer checkpoint stop-agreement grad-check desync-guard host-gemm attention; do
  "$bench" "$cmd" --help >/dev/null 2>&1 || fail "zero3-bench $cmd --help failed: no such benchmark"
done
if out="$("$bench" nonsense 2>&1)"; then fail "zero3-bench nonsense exited 0"; fi

out="$("$bench" attention --len 70 --heads 2 --head-dim 16 --rounds 1 2>&1)" || fail "zero3-bench attention failed: $out"
grep -q "^zero3 fp32 " <<<"$out" || fail "zero3-bench attention printed no zero3 fp32 row: $out"
sdpa="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/python/torch_sdpa.py"
if out="$("$bench" attention --len 70 --heads 2 --head-dim 16 --rounds 1 --torch-python /nonexistent/python \
  --torch-script "$sdpa" 2>&1)"; then
  fail "zero3-bench attention --torch-python /nonexistent/python exited 0"
elif ! grep -qF "/nonexistent/python" <<<"$out"; then
  fail "zero3-bench attention --torch-python /nonexistent/python: unexpected message: $out"
fi
if out="$("$bench" attention --len 70 --rounds 1 --torch-python python3 --torch-script /nonexistent/sdpa.py 2>&1)"; then
  fail "zero3-bench attention --torch-script /nonexistent/sdpa.py exited 0"
elif ! grep -qF "/nonexistent/sdpa.py: no such file" <<<"$out"; then
  fail "zero3-bench attention --torch-script /nonexistent/sdpa.py: unexpected message: $out"
fi

missing="$(mktemp -d)/zero3"
if out="$("$bench" train --zero3 "$missing" --world-sizes 1 --steps 1 2>&1)"; then
  fail "zero3-bench train --zero3 $missing exited 0"
elif ! grep -qF "$missing is not an executable zero3 program" <<<"$out"; then
  fail "zero3-bench train --zero3 $missing: unexpected message: $out"
fi
rmdir "$(dirname "$missing")"

finish "programs: ok (zero3 $version)"
