#!/usr/bin/env bash
# `zero3 train` on a job that diverges (the tiny GPT in bf16 with lr 1e4, no clipping, no schedule): the
# non-finite steps are skipped with a warning each, the run ends after zero3.nonfinite.max_consecutive of
# them in a row with a non-zero exit and never prints its "done" line; under policy "abort" it ends at the
# first one; with a limit too high to reach, the run completes and says how many steps it skipped.
# Usage: train_nonfinite_cli_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$1"
configs="$2"
mpiexec="$3"
shift 3
mpi_flags=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# The diverging job, with an optional zero3.nonfinite block.
make_config() {  # OUT NONFINITE_JSON STEPS
  python3 - "$configs/gpt-tiny-offload.json" "$1" "$2" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["gradient_clipping"] = 0
c["optimizer"]["params"]["lr"] = 1e4
c.pop("scheduler", None)
c["steps_per_print"] = 50
c["zero3"]["run"]["steps"] = int(sys.argv[4])
if sys.argv[3]:
    c["zero3"]["nonfinite"] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}

run() {  # NAME CONFIG: runs 2 ranks; sets $code and writes $tmp/NAME.out
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$2" >"$tmp/$1.out" 2>&1
  code=$?
}

# 1. The default policy: skip, then stop after 10 in a row.
make_config "$tmp/default.json" "" 3000
run default "$tmp/default.json"
[[ $code -ne 0 ]] || fail "default policy: exit 0 on a diverged run"
grep -q "^done:" "$tmp/default.out" && fail "default policy: printed its done line"
grep -q "the step is skipped (1 in a row" "$tmp/default.out" || fail "default policy: no skip warning"
grep -q "10 non-finite steps in a row (zero3.nonfinite.max_consecutive 10)" "$tmp/default.out" ||
  fail "default policy: the error does not name the limit: $(grep -i error "$tmp/default.out" | head -n 2)"
echo "default policy: exit $code after $(grep -c 'the step is skipped' "$tmp/default.out") skip warning(s)"

# 2. Policy abort: the first non-finite step ends the run.
make_config "$tmp/abort.json" '{"policy": "abort"}' 3000
run abort "$tmp/abort.json"
[[ $code -ne 0 ]] || fail "abort policy: exit 0"
grep -q "^done:" "$tmp/abort.out" && fail "abort policy: printed its done line"
grep -q 'zero3.nonfinite.policy is "abort"' "$tmp/abort.out" || fail "abort policy: the error does not say why"
grep -q "the step is skipped" "$tmp/abort.out" && fail "abort policy: a step was skipped before the abort"
echo "abort policy: exit $code"

# 3. A limit it never reaches: the run completes, counting its skipped steps.
make_config "$tmp/patient.json" '{"max_consecutive": 1000}' 30
run patient "$tmp/patient.json"
if grep -q "^done:" "$tmp/patient.out"; then
  grep -Eq "skipped +[1-9]" "$tmp/patient.out" || fail "high limit: the log line does not count skipped steps"
  echo "high limit: completed, exit $code"
else
  # The held-out loss may itself be non-finite by then: that must be the error.
  [[ $code -ne 0 ]] && grep -q "held-out loss after 30 steps" "$tmp/patient.out" ||
    fail "high limit: neither done nor the held-out error: $(tail -n 3 "$tmp/patient.out")"
  echo "high limit: the final held-out loss is not finite, exit $code"
fi

finish "all passed"
