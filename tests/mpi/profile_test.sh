#!/usr/bin/env bash
# `zero3 train --profile DIR` and `zero3 mem report DIR` end to end at world size 2 (the tiny GPT with CPU
# offload, a checkpoint saved mid-run, memory_breakdown on): the trace is well-formed trace-event JSON with
# a process per rank, the tracks of the streams, copies, CPU optimizer, checkpoint writer, model and
# phases, memory counters and one marker per step (tests/mpi/check_trace.py); every log line carries the
# phases' memory (JSONL too); the report prints its per-phase tables and step split and draws both PNGs.
# usage: profile_test.sh ZERO3 CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3=$1
configs=$2
shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

python3 - "$configs/gpt-tiny-offload.json" "$tmp/job.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["memory_breakdown"] = True
json.dump(c, open(sys.argv[2], "w"))
PY
out=$("${mpiexec[@]}" -np 2 "$zero3" train --config "$tmp/job.json" --steps 4 --log-interval 2 --progress off \
  --profile "$tmp/prof" --save-dir "$tmp/ckpt" --save-interval 2 --metrics "$tmp/m.jsonl" --run-dir "$tmp/run" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "train --profile exited $rc: $(tail -n 5 <<<"$out")"
for f in trace.json memory.json rank0.trace.json rank1.trace.json; do
  [ -s "$tmp/prof/$f" ] || fail "no $f in the profile directory"
done
python3 "$here/check_trace.py" "$tmp/prof/trace.json" 2 4 compute comm "copies" "cpu optimizer" \
  "checkpoint writer" model phases steps || fail "the trace is not well-formed"
grep -q "memory by phase" <<<"$out" || fail "memory_breakdown: no per-phase lines under the log lines"
grep -q "forward blocks.0" <<<"$out" || fail "memory_breakdown: no forward phase of blocks.0"
grep -q "where rank 0's peaks were reached" <<<"$out" || fail "memory_breakdown: no peak phases at the end"
python3 - "$tmp/m.jsonl" <<'PY' || fail "the JSONL records carry no per-phase memory"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert lines and all("memory" in l for l in lines), "no memory key"
phases = [p["phase"] for p in lines[-1]["memory"]]
assert "optimizer step" in phases and any(p.startswith("backward ") for p in phases), phases
p = lines[-1]["memory"][0]
assert set(p["peak_bytes"]) == {"device", "pinned_host", "pageable_host"}, p.keys()
PY
report=$("$zero3" mem report "$tmp/prof" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "mem report exited $rc: $(tail -n 5 <<<"$report")"
grep -q "memory by phase" <<<"$report" || fail "mem report: no per-phase table"
grep -q "step split" <<<"$report" || fail "mem report: no step split"
grep -q "plan vs measured" <<<"$report" || fail "mem report: no plan vs measured"
for png in memory.png step_split.png; do
  head -c 8 "$tmp/prof/$png" 2>/dev/null | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" ||
    fail "mem report: $png is not a PNG"
done
[ "$failures" -eq 0 ] || { echo "$out" | tail -n 30; echo "$report" | head -n 40; echo "$failures failure(s)"; exit 1; }
echo "profile: trace, per-phase memory, report and pictures all present"
