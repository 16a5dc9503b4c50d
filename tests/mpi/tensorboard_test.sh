#!/usr/bin/env bash
# DeepSpeed's `tensorboard` block in `zero3 train` at world size 2 (fp16 with dynamic loss scaling and CPU
# offload): one event file in <output_path>/<job_name>/, read back by tests/mpi/check_tensorboard.py with a
# reader written from the format's specification and with the tensorboard package's reader (without that
# package: exit 77, skipped, after every other check); its figures equal the run's JSONL metrics. An
# output_path that cannot be created is a named error.
# usage: tensorboard_test.sh ZERO3 CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
source "$(dirname "$0")/../support/skip.sh"
zero3=$1
configs=$2
shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

python3 - "$configs/zero3-fp16-dynamic.json" "$tmp" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["tensorboard"] = {"enabled": True, "output_path": sys.argv[2] + "/tb", "job_name": "job"}
json.dump(c, open(sys.argv[2] + "/job.json", "w"))
c["tensorboard"]["output_path"] = "/proc/no/such/dir"
json.dump(c, open(sys.argv[2] + "/bad.json", "w"))
PY
steps=6
out=$("${mpiexec[@]}" -np 2 "$zero3" train --config "$tmp/job.json" --steps $steps --log-interval 2 --progress off \
  --metrics "$tmp/m.jsonl" --run-dir "$tmp/run" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "train exited $rc: $(tail -n 5 <<<"$out")"
batch=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['train_batch_size'])" "$tmp/job.json")
python3 "$here/check_tensorboard.py" "$tmp/tb/job" "$tmp/m.jsonl" $steps "$batch" 1
rc=$?
skipped=""
if [ "$rc" -eq 77 ]; then
  skipped="the tensorboard package is not installed (tools/test.sh installs it): its reader did not read the event file"
elif [ "$rc" -ne 0 ]; then
  fail "the event file does not read back"
fi

out=$("${mpiexec[@]}" -np 2 "$zero3" train --config "$tmp/bad.json" --steps 2 --progress off --run-dir "$tmp/run2" 2>&1)
rc=$?
[ "$rc" -ne 0 ] || fail "an uncreatable tensorboard.output_path was accepted"
grep -q "tensorboard: cannot create directory /proc/no/such/dir/job" <<<"$out" || fail "no named error: $(tail -n 3 <<<"$out")"

[ "$failures" -eq 0 ] || exit 1
[ -z "$skipped" ] || skip "$skipped"
echo "tensorboard_test: all checks passed"
