#!/usr/bin/env bash
# `zero3 config lr-schedule` end to end: N "step lr" lines (or {"lr": [...]} with N entries, the same values)
# for every shipped config; bit-exact agreement with DeepSpeed's Python arithmetic on two of them; invalid
# files give the same stderr and exit 2 as `config check`; an optimizer or scheduler zero3 lacks gives exit 1.
# Usage: lr_schedule_cli_test.sh ZERO3_BINARY CONFIGS_DIR FIXTURES_DIR
set -u
zero3="$1"
configs="$2"
fixtures="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
steps=25

source "$(dirname "$0")/../support/checks.sh"

# run EXPECTED_CODE ARGS...: runs `zero3 config lr-schedule ARGS`, leaves stdout/stderr in $tmp.
run() {
  local expected="$1"
  shift
  "$zero3" config lr-schedule "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [[ $code -ne $expected ]]; then
    fail "lr-schedule $*: exit $code, expected $expected"
    sed 's/^/    /' "$tmp/err"
    return 1
  fi
  return 0
}

for f in "$configs"/*.json; do
  run 0 "$f" --steps "$steps" --world-size 2 || continue
  cp "$tmp/out" "$tmp/plain"
  python3 -c '
import sys
lines = open(sys.argv[1]).read().splitlines()
n = int(sys.argv[2])
assert len(lines) == n, f"{len(lines)} lines, expected {n}"
for i, line in enumerate(lines, 1):
    s, lr = line.split(" ")
    assert int(s) == i, f"line {i} starts with {s}"
    assert float(lr) >= 0.0, f"negative lr on line {i}: {lr}"
' "$tmp/plain" "$steps" || fail "$f: plain output"
  run 0 "$f" --steps "$steps" --json --world-size 2 || continue
  python3 -c '
import json, sys
lr = json.load(open(sys.argv[1]))["lr"]
n = int(sys.argv[3])
assert isinstance(lr, list) and len(lr) == n, f"{len(lr)} entries, expected {n}"
plain = [float(line.split(" ")[1]) for line in open(sys.argv[2]).read().splitlines()]
assert lr == plain, "the --json values differ from the plain ones"
' "$tmp/out" "$tmp/plain" "$steps" || fail "$f: --json output"
done

# Exact values, computed here with DeepSpeed's own float operations (lr_schedules.py) in Python.
# zero3-fp16-dynamic.json: WarmupLR, no warmup_max_lr (so the optimizer lr 1e-3), min 0, 20 log steps.
if run 0 "$configs/zero3-fp16-dynamic.json" --steps 30 --json --world-size 2; then
  python3 -c '
import json, math, sys
got = json.load(open(sys.argv[1]))["lr"]
inv = 1.0 / math.log(20)
def lr(t):
    if t < 0: return 0.0
    gamma = inv * math.log(t + 1) if t < 20 else 1.0
    return 0.0 + (1e-3 - 0.0) * gamma
want = [lr(k - 2) for k in range(1, 31)]
assert got == want, f"\n got  {got}\n want {want}"
' "$tmp/out" || fail "zero3-fp16-dynamic.json: values differ from DeepSpeed arithmetic"
fi
# zero3-bf16-ondevice.json: WarmupCosineLR on lr 3e-3, T 200, N 20 linear, cos_min_ratio 0.1; step 1 is 0.
if run 0 "$configs/zero3-bf16-ondevice.json" --steps 210 --json --world-size 2; then
  python3 -c '
import json, math, sys
got = json.load(open(sys.argv[1]))["lr"]
def ratio(t):
    if t < 0: return 0.0
    if t < 20: return 0.0 + (t / 20) * (1. - 0.0)
    p = min(1.0, (t - 20 + 1) / max(1, 200 - 20))
    return max(0.0, 0.1 + (1. - 0.1) * ((1 + math.cos(math.pi * p)) / 2))
want = [3e-3 * ratio(k - 2) for k in range(1, 211)]
assert got[0] == 0.0, "step 1 must run at lr 0"
assert got == want, f"\n got  {got}\n want {want}"
' "$tmp/out" || fail "zero3-bf16-ondevice.json: values differ from DeepSpeed arithmetic"
fi

# OneCycle with stairs in the cycle and decay after it (S = 10 + 6), and LRRangeTest staircase.
cat >"$tmp/one_cycle.json" <<'JSON'
{"train_batch_size": 8, "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10,
   "cycle_second_step_size": 6, "cycle_first_stair_count": 3, "decay_step_size": 4, "decay_lr_rate": 0.3}}}
JSON
if run 0 "$tmp/one_cycle.json" --steps 40 --json; then
  python3 -c '
import json, math, sys
got = json.load(open(sys.argv[1]))["lr"]
first, second, stairs = 10.0, 6.0, 3
total = first + second
ratio = first / total
def lr(t):
    if t == -1: return 1e-4
    if t < total:
        b = t + 1
        x = 1. + b / total - math.floor(1 + b / total)
        count = stairs
        s = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        ci = b % total
        pos = ci * count / first if ci <= first else (total - ci) * count / second
        s = math.floor(pos) / count
        return 1e-4 + (1e-3 - 1e-4) * s
    d = t - total + 1
    return 1e-4 / (1 + 0.3 * (d / 4))
want = [lr(k - 2) for k in range(1, 41)]
assert got == want, f"\n got  {got}\n want {want}"
' "$tmp/out" || fail "OneCycle: values differ from DeepSpeed arithmetic"
fi
cat >"$tmp/range_test.json" <<'JSON'
{"train_batch_size": 8, "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"},
 "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 7,
   "lr_range_test_step_rate": 0.7, "lr_range_test_staircase": true, "last_batch_iteration": 12}}}
JSON
if run 0 "$tmp/range_test.json" --steps 30 --json; then
  python3 -c '
import json, math, sys
got = json.load(open(sys.argv[1]))["lr"]
# Resumed at last_batch_iteration 12: step k uses t = 12 + k - 1.
want = [1e-4 * (1 + 0.7 * math.floor(float(12 + k - 1 + 1) / 7)) for k in range(1, 31)]
assert got == want, f"\n got  {got}\n want {want}"
' "$tmp/out" || fail "LRRangeTest: values differ from DeepSpeed arithmetic"
fi

# Invalid files: exit 2, nothing on stdout, stderr exactly as `config check` prints it.
for f in "$fixtures"/exit2/*.json "$tmp/does-not-exist.json"; do
  run 2 "$f" --steps 3 --world-size 2 || continue
  [[ -s "$tmp/out" ]] && fail "$f: printed a schedule although invalid"
  "$zero3" config check "$f" --world-size 2 >/dev/null 2>"$tmp/check_err"
  cmp -s "$tmp/err" "$tmp/check_err" || fail "$f: stderr differs from config check"
done

# No optimizer block, or a torch scheduler: valid DeepSpeed, but no lr zero3 can compute: exit 1, no output.
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 3}}' >"$tmp/no_optimizer.json"
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"},
       "scheduler": {"type": "StepLR", "params": {"step_size": 10}}}' >"$tmp/torch_scheduler.json"
for f in "$tmp/no_optimizer.json" "$tmp/torch_scheduler.json"; do
  run 1 "$f" --steps 3 || continue
  [[ -s "$tmp/out" ]] && fail "$f: printed a schedule it cannot compute"
  grep -qF "not implemented" "$tmp/err" || fail "$f: stderr does not say what is not implemented"
done

# --steps must be a positive number.
"$zero3" config lr-schedule "$configs/zero3-fp16-dynamic.json" --steps 0 --world-size 2 >/dev/null 2>&1 &&
  fail "--steps 0 accepted"

finish "all lr-schedule CLI checks passed"
