#!/usr/bin/env bash
# Checkpoints through `zero3 train` (docs/checkpoints.md):
#   1. exact resume: 2k steps straight vs k steps, save, a new job resumes and trains k more: every logged
#      loss, held-out loss, grad norm, lr and loss scale equal, and the final checkpoints' params, master,
#      moments and training state (loss scaler, lr schedule, counters) bitwise equal; at world sizes 1, 2, 4,
#      offload on and off (and params offloaded with persistent units), bf16 and fp16 (dynamic scaling with
#      overflows across the resume point);
#   2. reshard: saved at 4 ranks, loaded at 2 and at 3: re-saved tensors bitwise the saved ones, and the
#      continuation's losses match the 4-rank continuation within fp32 tolerance;
#   3. crash safety: 20 trials of kill -9 of a rank at a random moment of a job saving at every step:
#      `latest` always names a checkpoint that `zero3 ckpt info` verifies and a job resumes from;
#   4. a full disk (a small tmpfs, where it can be mounted): the save fails with a clear error (and a
#      checkpoint_save_failed event), training completes, the previous checkpoint stays intact;
#   5. bad resumes (missing latest, a tag that does not exist, not a checkpoint, conflicting model or
#      optimizer, a corrupt file): clear errors naming the problem, non-zero exit.
# Usage: ckpt_train_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$1"
configs="$2"
mpiexec="$3"
shift 3
mpi_flags=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'umount "$tmp/full" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
run() {  # run NP ARGS...: zero3 train at NP ranks, quiet
  local np="$1"
  shift
  if [[ "$np" -eq 1 ]]; then
    "$zero3" train --progress off "$@"
  else
    "$mpiexec" "${mpi_flags[@]}" -np "$np" "$zero3" train --progress off "$@"
  fi
}

# A small fast job: the tiny GPT, batch 24 (divisible by 1, 2, 3 and 4 ranks), every step logged.
python3 - "$configs/gpt-tiny-ondevice.json" "$tmp" <<'PY'
import copy, json, sys
base = json.load(open(sys.argv[1]))
base["train_batch_size"] = 24
base["train_micro_batch_size_per_gpu"] = 2
base.pop("gradient_accumulation_steps", None)
base["zero3"]["run"]["steps"] = 12
def write(name, precision, offload):
    c = copy.deepcopy(base)
    c.pop("bf16", None)
    c.pop("fp16", None)
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Starts far too high: overflows skip steps and halve the scale across the resume point.
        c["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 24, "loss_scale_window": 3,
                     "hysteresis": 2, "min_loss_scale": 1}
    if offload:
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    json.dump(c, open(f"{sys.argv[2]}/{name}.json", "w"))
for p in ("bf16", "fp16"):
    for o in (False, True):
        write(f"{p}-{'offload' if o else 'ondevice'}", p, o)
# Params offloaded too, with persistent units (whose device copies a load must refresh).
write("bf16-offloadparam", "bf16", True)
c = json.load(open(f"{sys.argv[2]}/bf16-offloadparam.json"))
c["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
c["zero_optimization"]["stage3_param_persistence_threshold"] = 20000
json.dump(c, open(f"{sys.argv[2]}/bf16-offloadparam.json", "w"))
write("fp32", "fp32", False)
PY

curve() {  # the logged numbers of steps > $2 in metrics file $1
  python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["step"] > int(sys.argv[2]):
        print(r["step"], repr(r["loss"]), repr(r["heldout_loss"]), repr(r["grad_norm"]), repr(r["lr"]),
              repr(r["loss_scale"]), r["skipped_steps"])
PY
}

# 1. Exact resume.
k=6
for np in 1 2 4; do
  for cfg in bf16-ondevice bf16-offload fp16-ondevice fp16-offload bf16-offloadparam; do
    d="$tmp/exact-$np-$cfg"
    mkdir -p "$d"
    run "$np" --config "$tmp/$cfg.json" --steps $((2 * k)) --log-interval 1 --heldout-samples 16 \
      --save-dir "$d/straight" --metrics "$d/straight.jsonl" >"$d/straight.out" 2>&1 ||
      { fail "$cfg np $np: straight run: $(tail -n 3 "$d/straight.out")"; continue; }
    run "$np" --config "$tmp/$cfg.json" --steps "$k" --log-interval 1 --heldout-samples 16 \
      --save-dir "$d/split" >"$d/first.out" 2>&1 || { fail "$cfg np $np: first half: $(tail -n 3 "$d/first.out")"; continue; }
    run "$np" --config "$tmp/$cfg.json" --steps $((2 * k)) --log-interval 1 --heldout-samples 16 \
      --save-dir "$d/split" --resume latest --metrics "$d/resumed.jsonl" >"$d/resumed.out" 2>&1 ||
      { fail "$cfg np $np: resumed run: $(tail -n 3 "$d/resumed.out")"; continue; }
    grep -q "resumed from checkpoint 'global_step$k' (step $k" "$d/resumed.out" || fail "$cfg np $np: no resume line"
    if [[ "$(curve "$d/straight.jsonl" $k)" != "$(curve "$d/resumed.jsonl" $k)" ]]; then
      fail "$cfg np $np: logged numbers differ after the resume"
      diff <(curve "$d/straight.jsonl" $k) <(curve "$d/resumed.jsonl" $k) | head -n 6
    fi
    python3 "$here/ckpt_tensors.py" same "$d/straight/global_step$((2 * k))" "$d/split/global_step$((2 * k))" \
      >"$d/same.out" || fail "$cfg np $np: final checkpoints differ: $(cat "$d/same.out")"
    [[ "$(python3 "$here/ckpt_tensors.py" state "$d/straight/global_step$((2 * k))" | sed 's/"data":[^,]*,//')" == \
       "$(python3 "$here/ckpt_tensors.py" state "$d/split/global_step$((2 * k))" | sed 's/"data":[^,]*,//')" ]] ||
      fail "$cfg np $np: final training state differs"
  done
done
# The fp16 runs did skip steps (the loss scaler's state is exercised across the resume point).
python3 - "$tmp/exact-2-fp16-ondevice/straight.jsonl" <<'PY' || fail "fp16 runs skipped no step"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if rows[-1]["skipped_steps"] > 0 else 1)
PY
echo "exact resume: checked at np 1, 2, 4 x bf16/fp16 x offload on/off (+ offload_param with persistent units)"

# 2. Reshard: save at 4 ranks, load at 2 and 3.
d="$tmp/reshard"
mkdir -p "$d"
run 4 --config "$tmp/fp32.json" --steps "$k" --save-dir "$d/w4" >"$d/w4.out" 2>&1 || fail "reshard: 4-rank save: $(tail -n 3 "$d/w4.out")"
run 4 --config "$tmp/fp32.json" --steps $((2 * k)) --log-interval 1 --heldout-samples 16 --save-dir "$d/w4" \
  --resume latest --metrics "$d/w4-cont.jsonl" >"$d/w4-cont.out" 2>&1 || fail "reshard: 4-rank continuation"
for np in 2 3; do
  # Loading at np ranks and saving at once: the re-saved tensors are the saved ones, bit for bit.
  run "$np" --config "$tmp/fp32.json" --steps "$k" --resume "$d/w4/global_step$k" --save-dir "$d/w$np" \
    >"$d/w$np.out" 2>&1 || fail "reshard: load at np $np: $(tail -n 3 "$d/w$np.out")"
  python3 "$here/ckpt_tensors.py" same "$d/w4/global_step$k" "$d/w$np/global_step$k" >"$d/same$np.out" ||
    fail "reshard to np $np: tensors differ: $(cat "$d/same$np.out")"
  run "$np" --config "$tmp/fp32.json" --steps $((2 * k)) --log-interval 1 --heldout-samples 16 \
    --resume "$d/w4/global_step$k" --metrics "$d/w$np-cont.jsonl" >"$d/w$np-cont.out" 2>&1 ||
    fail "reshard: np $np continuation"
  python3 - "$d/w4-cont.jsonl" "$d/w$np-cont.jsonl" "$np" <<'PY' || fail "reshard: np $np continuation diverges"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) == 6, (len(a), len(b))
worst = max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "heldout_loss", "grad_norm"))
print(f"reshard 4 -> {sys.argv[3]}: continuation within {worst:.1e} of the 4-rank one")
sys.exit(0 if worst <= 1e-4 else 1)
PY
done

# 3. Crash safety: kill -9 one rank at a random moment while it saves every step; latest must verify.
d="$tmp/crash"
trials=0
for trial in $(seq 1 20); do
  rm -rf "$d"
  mkdir -p "$d"
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/bf16-offload.json" --steps 200 \
    --save-dir "$d/ckpt" --save-interval 1 --log-interval 1000 >"$d/run.out" 2>&1 &
  launcher=$!
  sleep "$(python3 -c "import random; print(round(random.uniform(1.0, 3.0), 2))")"
  victim=$(pgrep -f "zero3 train --progress off --config $tmp/bf16-offload.json" | grep -v "^$launcher$" | shuf -n 1)
  [[ -n "$victim" ]] && kill -9 "$victim"
  wait "$launcher" 2>/dev/null
  trials=$((trials + 1))
  if [[ ! -f "$d/ckpt/latest" ]]; then
    continue  # killed before the first commit: nothing to check (but nothing half-done may claim to be latest)
  fi
  latest=$(cat "$d/ckpt/latest")
  "$zero3" ckpt info "$d/ckpt" >"$d/info.out" 2>&1 || fail "crash trial $trial: latest ($latest) does not verify: $(tail -n 2 "$d/info.out")"
  run 2 --config "$tmp/bf16-offload.json" --steps 1 --resume "$d/ckpt" >"$d/resume.out" 2>&1 ||
    fail "crash trial $trial: cannot resume from $latest: $(tail -n 2 "$d/resume.out")"
  echo "crash trial $trial: killed during saves; latest = $latest verifies and resumes"
done

# 4. A full disk: the second save does not fit.
mkdir -p "$tmp/full"
if mount -t tmpfs -o size=2400k tmpfs "$tmp/full" 2>/dev/null; then
  # The run directory elsewhere: events.jsonl on the full disk could not take the failure's line either.
  run 2 --config "$tmp/bf16-offload.json" --steps 6 --save-interval 3 --save-dir "$tmp/full/ckpt" \
    --run-dir "$tmp/full-run" --metrics "$tmp/full.jsonl" >"$tmp/full.out" 2>&1
  code=$?
  [[ $code -ne 0 ]] || fail "full disk: exit 0"
  grep -q "No space left on device\|no space left on device" "$tmp/full.out" || fail "full disk: no ENOSPC message: $(grep -i checkpoint "$tmp/full.out" | head -n 3)"
  grep -q "previous checkpoint is intact (latest: global_step3)" "$tmp/full.out" || fail "full disk: the report does not name the intact checkpoint"
  grep -q '"step": 6, "kind": "checkpoint_save_failed".*latest: global_step3' "$tmp/full-run/events.jsonl" ||
    fail "full disk: no checkpoint_save_failed event in the run directory"
  [[ "$(wc -l <"$tmp/full.jsonl")" -ge 1 ]] && grep -q '"step": *6\|"step":6' "$tmp/full.jsonl" || fail "full disk: training did not complete"
  "$zero3" ckpt info "$tmp/full/ckpt" >/dev/null 2>&1 || fail "full disk: the previous checkpoint does not verify"
  [[ "$(cat "$tmp/full/ckpt/latest")" == "global_step3" ]] || fail "full disk: latest moved"
  echo "full disk: save failed cleanly, global_step3 intact"
  umount "$tmp/full"
else
  echo "full disk: skipped (cannot mount a tmpfs here)"
fi

# 5. Bad resumes.
expect_error() {
  local what="$1" pattern="$2"
  shift 2
  run 1 "$@" >"$tmp/bad.out" 2>&1
  local code=$?
  if [[ $code -eq 0 ]]; then
    fail "$what: exit 0"
  elif ! grep -q -- "$pattern" "$tmp/bad.out"; then
    fail "$what: no '$pattern' in: $(head -c 500 "$tmp/bad.out")"
  elif grep -q -E "Segmentation|terminate called|core dumped" "$tmp/bad.out"; then
    fail "$what: crashed"
  fi
}
good="$tmp/exact-1-bf16-ondevice/split"
mkdir -p "$tmp/empty"
expect_error "missing latest" "no checkpoint at" --config "$tmp/bf16-ondevice.json" --resume "$tmp/empty"
expect_error "unknown tag" "global_step99" --config "$tmp/bf16-ondevice.json" --resume "$good/global_step99"
expect_error "not a checkpoint" "no checkpoint at" --config "$tmp/bf16-ondevice.json" --resume "$configs"
expect_error "--resume latest without --save-dir" "save-dir" --config "$tmp/bf16-ondevice.json" --resume latest
expect_error "model conflict" "shape" --config "$tmp/bf16-ondevice.json" --model.hidden_size 32 --resume "$good"
python3 - "$tmp/bf16-ondevice.json" "$tmp/lion.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["optimizer"] = {"type": "Lion", "params": {"lr": 1e-4}}
json.dump(c, open(sys.argv[2], "w"))
PY
expect_error "optimizer conflict" "optimizer" --config "$tmp/lion.json" --resume "$good"
cp -r "$good" "$tmp/corrupt"
python3 - "$tmp/corrupt/global_step$((2 * k))/rank_00000.bin" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x10
open(p, "wb").write(b)
PY
expect_error "bit flip" "rank_00000.bin" --config "$tmp/bf16-ondevice.json" --resume "$tmp/corrupt"
truncate -s 100 "$tmp/corrupt/global_step$((2 * k))/rank_00000.bin"
expect_error "truncated file" "rank_00000.bin" --config "$tmp/bf16-ondevice.json" --resume "$tmp/corrupt"

finish "checkpoint CLI: all checks passed"
