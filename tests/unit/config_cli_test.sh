#!/usr/bin/env bash
# `zero3 config check` end to end: exit codes 0/1/2 on the shipped configs/ and on the fixtures, the
# expected diagnostic (path included) on stderr, nothing on stdout for invalid files, and the world size
# taken from --world-size, the launcher environment or the default.
# Usage: config_cli_test.sh ZERO3_BINARY CONFIGS_DIR FIXTURES_DIR
set -u
zero3="$1"
configs="$2"
fixtures="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# check EXPECTED_CODE FILE [ARGS...]: runs `zero3 config check`, leaves stdout/stderr in $tmp.
check() {
  local expected="$1" file="$2"
  shift 2
  "$zero3" config check "$file" "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [[ $code -ne $expected ]]; then
    fail "$file $*: exit $code, expected $expected"
    sed 's/^/    /' "$tmp/err"
    return 1
  fi
  return 0
}

expect_stderr() {
  local file="$1" needle="$2"
  grep -qF -- "$needle" "$tmp/err" || { fail "$file: stderr lacks: $needle"; sed 's/^/    /' "$tmp/err"; }
}

# The shipped example configs: valid and runnable at world size 2; stdout is the resolved JSON, which
# is itself a valid config with the same meaning.
for f in "$configs"/*.json; do
  check 0 "$f" --world-size 2 --strict || continue  # the shipped configs are lint-clean too
  cp "$tmp/out" "$tmp/resolved.json"
  check 0 "$tmp/resolved.json" --world-size 2 || continue
  cmp -s "$tmp/out" "$tmp/resolved.json" || fail "$f: resolved config does not reproduce itself"
done

# Fixtures: the directory names the exit code; a .expect file holds a line stderr must contain.
for code in 0 1 2; do
  for f in "$fixtures/exit$code"/*.json; do
    check "$code" "$f" --world-size 2 || continue
    [[ -f "${f%.json}.expect" ]] && expect_stderr "$f" "$(cat "${f%.json}.expect")"
    if [[ $code -eq 2 && -s "$tmp/out" ]]; then fail "$f: printed a config although invalid"; fi
    if [[ $code -ne 2 && ! -s "$tmp/out" ]]; then fail "$f: printed no resolved config"; fi
  done
done

# Missing file, a directory: exit 2 naming the path, no crash.
check 2 "$tmp/does-not-exist.json" && expect_stderr missing "error: $tmp/does-not-exist.json: cannot open the file"
check 2 "$tmp" && expect_stderr directory "error: $tmp: is a directory"

# World size: the batch fixture needs W = 2.
batch="$fixtures/exit2/batch_mismatch.json"
ok="$configs/zero3-bf16-ondevice.json"
env -u OMPI_COMM_WORLD_SIZE -u WORLD_SIZE "$zero3" config check "$ok" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 0 ]] || fail "$ok without a world size: expected exit 0 (world size 1)"
expect_stderr "$ok" "world size 1 (default"
env -u WORLD_SIZE OMPI_COMM_WORLD_SIZE=2 "$zero3" config check "$batch" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 2 ]] || fail "$batch with OMPI_COMM_WORLD_SIZE=2: expected exit 2"
expect_stderr "$batch" "world size (2, from OMPI_COMM_WORLD_SIZE)"
env -u OMPI_COMM_WORLD_SIZE WORLD_SIZE=2 "$zero3" config check "$batch" >"$tmp/out" 2>"$tmp/err"
expect_stderr "$batch" "world size (2, from WORLD_SIZE)"
env -u OMPI_COMM_WORLD_SIZE WORLD_SIZE=2 "$zero3" config check "$batch" --world-size 3 >"$tmp/out" 2>"$tmp/err"
expect_stderr "$batch" "world size (3, from --world-size)"
env -u OMPI_COMM_WORLD_SIZE WORLD_SIZE=two "$zero3" config check "$ok" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 2 ]] || fail "WORLD_SIZE=two: expected exit 2"
expect_stderr "$ok" "error: WORLD_SIZE:"

# --quiet drops notes and warnings but keeps not-implemented lines.
check 1 "$fixtures/exit1/nvme_params_optimizer_on_device.json" --world-size 2 --quiet
grep -q '^note:' "$tmp/err" && fail "--quiet still printed notes"
expect_stderr quiet "not implemented: zero_optimization.offload_param.device"

# --strict: the HF config's "auto" notes stay notes; a key DeepSpeed ignores becomes an error.
check 0 "$fixtures/exit0/hf_trainer_zero3_auto.json" --world-size 2 --strict
printf '{"train_batch_size": 8, "_comment": "x", "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}}' \
  >"$tmp/comment.json"
check 0 "$tmp/comment.json"
expect_stderr comment "warning: _comment: unknown key"
check 2 "$tmp/comment.json" --strict
expect_stderr comment "error: _comment: unknown key"

# The key table prints and names a few keys.
"$zero3" config keys >"$tmp/out" 2>"$tmp/err" || fail "config keys failed"
grep -q "stage3_prefetch_bucket_size" "$tmp/out" || fail "config keys lacks stage3_prefetch_bucket_size"

finish "all config CLI checks passed"
