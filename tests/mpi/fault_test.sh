#!/usr/bin/env bash
# Fault injection through `zero3 train` at 2 ranks (ZERO3_FAULT, runtime/include/zero3/comm/fault.hpp): a
# rank that stops (SIGSTOP; rank 1, and rank 0, which serves the progress store; rank 1 inside a collective it
# entered, which the launcher's SIGCONT wakes before the kill), an injected MPI error, a skipped gather, an
# extra micro-batch, a collective
# issued by one rank only; each with and without the desync guard where it matters. Every case must end
# the job with a non-zero exit within zero3.comm.timeout_s + 30 s, with a report that names the op, the
# unit, the step and the missing (or failing) rank, and `zero3 debug flight` on the ranks' dumps must name
# the same rank and op. The expected names come from the fault and the model (units embed, blocks.0,
# blocks.1, head; a step starts with the gather of embed), not from a previous run.
# Usage: fault_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
# Environment: FAULT_TRIALS (runs per case, default 2), FAULT_TIMEOUT_S (default 10), FAULT_TABLE=1 prints
# a table of the trials (tools/fault-trials.sh), FAULT_CASES (space-separated case names, default all).
set -u
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$3"
shift 3
mpi_flags=("$@")
trials="${FAULT_TRIALS:-2}"
timeout_s="${FAULT_TIMEOUT_S:-10}"
bound=$((timeout_s + 30))
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# The tiny GPT with 2 micro-batches per step (so an extra one shifts the window), timeout_s from above.
for guard in false true; do
  python3 - "$configs/gpt-tiny-ondevice.json" "$tmp/guard_$guard.json" "$timeout_s" "$guard" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = 8
c["zero3"]["comm"] = {"timeout_s": float(sys.argv[3]), "desync_check": sys.argv[4] == "true"}
open(sys.argv[2], "w").write(json.dumps(c))
PY
done

# case name | ZERO3_FAULT | guard | what the report must say (grep -E patterns, all, ~-separated) | what
# `zero3 debug flight` must say
cases=(
  "stall|stall:rank=1:step=3|false|did not complete within ${timeout_s} s~all_gather #[0-9]+ .*gather unit embed, step 3~missing: rank 1|^rank 1 (never entered|stalled first: stopped .* before entering) all_gather #[0-9]+ \(unit embed, step 3, micro-batch 0\)"
  "stall_in_collective|stall_in_collective:rank=1:step=3|false|did not complete within ${timeout_s} s~missing: rank 1~rank 1 entered all_gather #[0-9]+ but has been silent for|^rank 1 (never entered|stalled first: stopped .* while in) all_gather #[0-9]+ \(unit embed, step 3, micro-batch 0\)"
  "stall_rank0|stall:rank=0:step=3|false|did not complete within ${timeout_s} s~all_gather #[0-9]+ .*gather unit embed, step 3~missing: rank 0~the progress store on rank 0 does not answer: rank 0 is the missing one|^rank 0 (never entered|stalled first: stopped .* before entering) all_gather #[0-9]+ \(unit embed, step 3, micro-batch 0\)"
  "mpi_error|mpi_error:rank=1:step=3|false|rank 1: all_gather #[0-9]+ .*injected by ZERO3_FAULT~gather unit embed, step 3~job aborted by rank 1|^rank 1's all_gather #[0-9]+ \(unit embed, step 3, micro-batch 0\) failed"
  "skip_gather+guard|skip_gather:rank=1:step=3:unit=2|true|desync guard~rank 0: all_gather #[0-9]+ \([^)]*gather unit blocks.1, step 3~rank 1: all_gather #[0-9]+ \([^)]*gather unit head, step 3|^the ranks issued different collectives as mpi #[0-9]+: rank 0 all_gather #[0-9]+ \(unit blocks.1, step 3, micro-batch 0\); rank 1 all_gather #[0-9]+ \(unit head, step 3"
  "skip_gather|skip_gather:rank=1:step=3:unit=2|false||"
  "extra_micro_batch+guard|extra_micro_batch:rank=1:step=3|true|desync guard~rank 0: all_gather #[0-9]+ \([^)]*gather unit embed, step 4, micro-batch 0~rank 1: all_gather #[0-9]+ \([^)]*gather unit embed, step 3, micro-batch 2|^the ranks issued different collectives as mpi #[0-9]+: rank 0 all_gather #[0-9]+ \(unit embed, step 4, micro-batch 0\); rank 1 all_gather #[0-9]+ \(unit embed, step 3, micro-batch 2\)"
  "extra_micro_batch|extra_micro_batch:rank=1:step=3|false|did not complete within ${timeout_s} s~missing: rank [01]|^(rank [01] never entered |the ranks issued different collectives as mpi #[0-9]+: rank 0 all_gather #[0-9]+ \(unit embed, step 4, micro-batch 0\); rank 1 all_gather #[0-9]+ \(unit embed, step 3, micro-batch 2\))"
  "extra_collective+guard|extra_collective:rank=0:step=3|true|desync guard~rank 0: all_gather #[0-9]+ \(fp32 x 1, [^)]*fault unit extra_collective, step 3~rank 1: all_gather #[0-9]+ \([^)]*gather unit embed, step 3|^the ranks issued different collectives as mpi #[0-9]+: rank 0 all_gather #[0-9]+ \(unit extra_collective, step 3, micro-batch 0\); rank 1 all_gather #[0-9]+ \(unit embed, step 3"
  "extra_collective|extra_collective:rank=0:step=3|false|rank 0: all_gather #[0-9]+ \(fp32 x 1\) failed~fault unit extra_collective, step 3|^(the ranks issued different collectives as mpi #[0-9]+: rank 0 all_gather #[0-9]+ \(unit extra_collective, step 3|rank 0's all_gather #[0-9]+ \(unit extra_collective, step 3)"
)

rows="$tmp/rows.tsv"
: >"$rows"
for entry in "${cases[@]}"; do
  IFS='|' read -r name fault guard report_pats debug_pat <<<"$entry"
  if [ -n "${FAULT_CASES:-}" ] && ! [[ " $FAULT_CASES " == *" $name "* ]]; then continue; fi
  for trial in $(seq 1 "$trials"); do
    dir="$tmp/$name.$trial"
    mkdir -p "$dir"
    start=$(date +%s.%N)
    (cd "$dir" && ZERO3_FAULT="$fault" timeout $((bound + 30)) "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train \
      --progress off --config "$tmp/guard_$guard.json" --steps 12 --log-interval 5 >out.txt 2>&1)
    rc=$?
    elapsed=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
    ok=1
    what="-"
    if [ "$rc" -eq 0 ]; then
      fail "$name #$trial: the job exited 0"
      ok=0
    elif [ "$rc" -eq 124 ]; then
      fail "$name #$trial: still running after $((bound + 30)) s"
      ok=0
    fi
    if python3 -c "import sys; sys.exit(0 if $elapsed <= $bound else 1)"; then :; else
      fail "$name #$trial: took ${elapsed} s, more than timeout_s + 30 = ${bound} s"
      ok=0
    fi
    if ! grep -q "^zero3 train:" "$dir/out.txt"; then
      fail "$name #$trial: the job did not start: $(tail -n 3 "$dir/out.txt")"
      ok=0
    fi
    if grep -q "^done:" "$dir/out.txt"; then
      fail "$name #$trial: a rank printed done"
      ok=0
    fi
    if [ -n "$report_pats" ]; then
      IFS='~' read -r -a pats <<<"$report_pats"
      for p in "${pats[@]}"; do
        grep -Eq -- "$p" "$dir/out.txt" || {
          fail "$name #$trial: the report lacks /$p/: $(grep -E 'error' "$dir/out.txt" | head -n 3)"
          ok=0
        }
      done
      flight="$(dirname "$(find "$dir" -path '*flight/rank*.json' | head -n 1)")"
      if [ "$flight" = "." ]; then
        fail "$name #$trial: no flight record was written"
        ok=0
      else
        "$zero3" debug flight "$flight" >"$dir/debug.txt" 2>&1 || true
        what="$(head -n 1 "$dir/debug.txt")"
        head -n 1 "$dir/debug.txt" | grep -Eq -- "$debug_pat" || {
          fail "$name #$trial: zero3 debug flight says '$what', expected /$debug_pat/"
          ok=0
        }
      fi
    else
      what="(no report expected: MPI got mismatched sizes) $(grep -Eo 'signal [0-9]+ \([A-Za-z ]+\)|did not complete|MPI_ERR_[A-Z]+' "$dir/out.txt" | head -n 1)"
    fi
    # The stopped rank, woken, must not blame the rank that reported it.
    if [[ "$name" == stall_in_collective ]] && grep -Eq "rank 1: .*missing: rank 0" "$dir/out.txt"; then
      fail "$name #$trial: rank 1 blames rank 0: $(grep -E "rank 1: .*missing: rank 0" "$dir/out.txt" | head -n 1)"
      ok=0
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$elapsed" "$ok" "$what" >>"$rows"
    [ "$ok" -eq 1 ] || { echo "--- $name #$trial output:"; tail -n 25 "$dir/out.txt"; }
  done
done

if [ "${FAULT_TABLE:-0}" = "1" ]; then
  python3 - "$rows" "$timeout_s" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"\nfault trials, 2 ranks, zero3.comm.timeout_s = {sys.argv[2]}")
print("| case | trials | all exits non-zero | checks passed | time to exit median / max (s) | named (zero3 debug flight, first trial) |")
print("|---|---|---|---|---|---|")
for name in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == name]
    t = [float(r[2]) for r in rs]
    nonzero = sum(1 for r in rs if r[1] not in ("0", "124"))
    passed = sum(1 for r in rs if r[3] == "1")
    print(f"| {name} | {len(rs)} | {nonzero}/{len(rs)} | {passed}/{len(rs)} | {statistics.median(t):.1f} / {max(t):.1f} | {rs[0][4]} |")
PY
fi

finish "fault injection: all cases passed ($trials trial(s) each, timeout_s $timeout_s)"
