#!/usr/bin/env bash
# `zero3 train` end to end on the shipped tiny GPT jobs: the held-out loss reaches the data's entropy floor
# (within 0.1 nats/token, and not below it) at world size 2 with CPU offload; two runs with one seed give
# the same curve bit for bit; world sizes 1 and 2 give the same curve within fp32 tolerance; bad input
# (missing token file, token id >= vocab, unknown model field, context longer than the data, a file name
# that is not UTF-8) is a clear
# error and a non-zero exit; the MLP quick job reaches the floor; wall_clock_breakdown's step split adds up
# and leaves the numbers alone; `zero3-bench train` runs; stage3_gather_16bit_weights_on_model_save writes
# model.safetensors into each checkpoint; the start-up line gives the job's shape; under mpirun's default
# binding (each rank bound to a core) no rank starts more compute threads than its CPU mask has (oneTBB
# would warn).
# Usage: train_cli_test.sh ZERO3_BINARY ZERO3_BENCH_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$1"
zero3_bench="$2"
configs="$3"
mpiexec="$4"
shift 4
mpi_flags=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# 1. The README job: gpt-tiny-offload over 2 ranks reaches the floor.
"$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$configs/gpt-tiny-offload.json" \
  --metrics "$tmp/tiny.jsonl" >"$tmp/tiny.out" 2>&1 || fail "gpt-tiny-offload run failed: $(tail -n 5 "$tmp/tiny.out")"
python3 - "$tmp/tiny.jsonl" <<'PY' || fail "gpt-tiny-offload did not reach the entropy floor"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = rows[-1]
gap = last["heldout_loss"] - last["entropy_floor"]
print(f"gpt-tiny-offload: {last['step']} steps, held-out {last['heldout_loss']:.4f}, floor {last['entropy_floor']:.4f}, gap {gap:+.4f}")
for k in ("step", "loss", "heldout_loss", "entropy_floor", "lr", "grad_norm", "loss_scale", "skipped_steps", "tokens_per_s"):
    assert k in last, k
sys.exit(0 if 0.0 <= gap <= 0.1 else 1)
PY

grep -q "job: 2 rank(s) on 1 node(s), 2 on this node (.*); world from mpirun" "$tmp/tiny.out" ||
  fail "no start-up line with the job's shape: $(head -n 5 "$tmp/tiny.out")"

# 1b. mpirun's default binding: a core per rank (the test flags say --bind-to none; here it is left out).
bound_flags=()
for f in "${mpi_flags[@]}"; do [[ "$f" == --bind-to || "$f" == none ]] || bound_flags+=("$f"); done
"$mpiexec" "${bound_flags[@]}" --bind-to core -np 2 "$zero3" train --progress off --steps 3 \
  --config "$configs/gpt-tiny-offload.json" >"$tmp/bound.out" 2>&1 || fail "bound run failed: $(tail -n 5 "$tmp/bound.out")"
if grep -qi "tbb warning" "$tmp/bound.out"; then fail "ranks bound to a core: $(grep -i -m1 "tbb warning" "$tmp/bound.out")"; fi

# 2. Same seed, same curve (bitwise); world size 1 vs 2 in fp32 within tolerance.
python3 - "$configs/gpt-tiny-ondevice.json" "$tmp/fp32.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.pop("bf16", None)
open(sys.argv[2], "w").write(json.dumps(c))
PY
for run in a b; do
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/fp32.json" --steps 30 --log-interval 5 \
    --metrics "$tmp/w2$run.jsonl" >"$tmp/w2$run.out" 2>&1 || fail "fp32 run $run at np 2 failed"
done
"$zero3" train --config "$tmp/fp32.json" --steps 30 --log-interval 5 --metrics "$tmp/w1.jsonl" >"$tmp/w1.out" 2>&1 ||
  fail "fp32 run at np 1 failed"
python3 - "$tmp/w2a.jsonl" "$tmp/w2b.jsonl" "$tmp/w1.jsonl" <<'PY' || fail "loss curves differ"
import json, sys
def curve(p):
    return [(r["step"], r["loss"], r["heldout_loss"], r["grad_norm"]) for r in map(json.loads, open(p))]
a, b, one = (curve(p) for p in sys.argv[1:4])
assert a == b, f"same seed, different curves:\n{a}\n{b}"
worst = max(abs(x - y) / abs(y) for ra, r1 in zip(a, one) for x, y in zip(ra[1:], r1[1:]))
print(f"np 2 vs np 1: worst relative difference {worst:.2e} over {len(a)} logged steps")
sys.exit(0 if len(a) == len(one) == 6 and worst <= 1e-4 else 1)
PY

# 3. csv_monitor writes DeepSpeed's layout: <output_path>/<job_name>/Train_Samples_<name>.csv.
python3 - "$tmp/fp32.json" "$tmp/csv.json" "$tmp/csv" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["csv_monitor"] = {"enabled": True, "output_path": sys.argv[3], "job_name": "tiny"}
open(sys.argv[2], "w").write(json.dumps(c))
PY
"$zero3" train --config "$tmp/csv.json" --steps 4 >"$tmp/csv.out" 2>&1 || fail "csv_monitor run failed"
python3 - "$tmp/csv/tiny" <<'PY' || fail "csv_monitor files"
import csv, os, sys
d = sys.argv[1]
for name, header in (("Train_Samples_train_loss.csv", "train_loss"), ("Train_Samples_lr.csv", "lr")):
    rows = list(csv.reader(open(os.path.join(d, name))))
    assert rows[0] == ["step", header], rows[0]
    assert [int(r[0]) for r in rows[1:]] == [32, 64, 96, 128], rows
    float(rows[1][1])
PY

# 4. Bad input: each a clear error naming it, exit non-zero.
expect_error() {
  local what="$1" pattern="$2"
  shift 2
  "$zero3" train "$@" >"$tmp/bad.out" 2>&1
  local code=$?
  if [[ $code -eq 0 ]]; then
    fail "$what: exit 0"
  elif ! grep -q -- "$pattern" "$tmp/bad.out"; then
    fail "$what: no '$pattern' in: $(head -c 400 "$tmp/bad.out")"
  elif grep -q -E "Segmentation|terminate called|core dumped" "$tmp/bad.out"; then
    fail "$what: crashed"
  fi
}
python3 - "$tmp" <<'PY'
import struct, sys, os
d = sys.argv[1]
def write(name, ids, vocab, width=2):
    with open(os.path.join(d, name), "wb") as f:
        f.write(b"ZERO3TOK" + struct.pack("<IIQQ", 1, width, vocab, len(ids)))
        f.write(struct.pack("<%d%s" % (len(ids), "H" if width == 2 else "I"), *ids))
write("bad_id.bin", [1, 2, 3, 99, 4] * 100, 16)
write("short.bin", list(range(16)) * 3, 16)
PY
expect_error "missing token file" "nowhere.bin" --config "$tmp/fp32.json" --data.source "tokens:$tmp/nowhere.bin"
expect_error "token id >= vocab" "99" --config "$tmp/fp32.json" --data.source "tokens:$tmp/bad_id.bin"
expect_error "context longer than the data" "short.bin" --config "$tmp/fp32.json" --data.source "tokens:$tmp/short.bin"
python3 - "$tmp/fp32.json" "$tmp/unknown.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero3"]["model"]["layerz"] = 2
open(sys.argv[2], "w").write(json.dumps(c))
PY
expect_error "unknown model field" "zero3.model.layerz" --config "$tmp/unknown.json"
# A file name that is not UTF-8 (JSON text is UTF-8): named as such, not a JSON library error.
expect_error "a file name that is not UTF-8" "data.source: the value is not valid UTF-8" --config "$tmp/fp32.json" \
  --data.source "tokens:$tmp/tok"$'\xff'".bin"
if grep -q "json.exception\|type_error" "$tmp/bad.out"; then fail "a file name that is not UTF-8: $(head -c 300 "$tmp/bad.out")"; fi

# 5. The MLP quick job reaches the floor too (it sees the last seq_len = markov_order tokens).
"$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$configs/mlp-tiny.json" \
  --metrics "$tmp/mlp.jsonl" >"$tmp/mlp.out" 2>&1 || fail "mlp-tiny run failed: $(tail -n 5 "$tmp/mlp.out")"
python3 - "$tmp/mlp.jsonl" <<'PY' || fail "mlp-tiny did not reach the entropy floor"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
gap = last["heldout_loss"] - last["entropy_floor"]
print(f"mlp-tiny: {last['step']} steps, held-out {last['heldout_loss']:.4f}, floor {last['entropy_floor']:.4f}, gap {gap:+.4f}")
sys.exit(0 if 0.0 <= gap <= 0.1 else 1)
PY

# 6. wall_clock_breakdown: the step split is reported, adds up, and does not change the numbers.
python3 - "$tmp/fp32.json" "$tmp/wcb.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["wall_clock_breakdown"] = True
c["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
open(sys.argv[2], "w").write(json.dumps(c))
c["wall_clock_breakdown"] = False
open(sys.argv[2] + ".off", "w").write(json.dumps(c))
PY
start=$(date +%s%N)
"$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/wcb.json" --steps 20 --log-interval 5 \
  --metrics "$tmp/wcb.jsonl" >"$tmp/wcb.out" 2>&1 || fail "wall_clock_breakdown run failed"
wall_ns=$(($(date +%s%N) - start))
"$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/wcb.json.off" --steps 20 --log-interval 5 \
  --metrics "$tmp/wcb-off.jsonl" >"$tmp/wcb-off.out" 2>&1 || fail "run without wall_clock_breakdown failed"
grep -q "time/step .* = forward .* + backward .* + step .*waiting for gathers" "$tmp/wcb.out" ||
  fail "no time split line in: $(head -c 600 "$tmp/wcb.out")"
python3 - "$tmp/wcb.jsonl" "$tmp/wcb-off.jsonl" "$wall_ns" <<'PY' || fail "step split"
import json, sys
on = [json.loads(l) for l in open(sys.argv[1])]
off = [json.loads(l) for l in open(sys.argv[2])]
wall = int(sys.argv[3]) / 1e9
assert [(r["loss"], r["grad_norm"]) for r in on] == [(r["loss"], r["grad_norm"]) for r in off], "timing changed the numbers"
assert all("time_ms" not in r for r in off)
for r in on:
    t = r["time_ms"]
    parts = t["forward"] + t["backward"] + t["step"]
    # Each wait is part of the phase it stalls: gathers stall forward and backward, reductions step().
    assert t["gather_wait"] <= t["forward"] + t["backward"], t
    assert t["copies_exposed"] <= t["total"], t
    assert abs(parts - t["total"]) <= 1e-6 * max(1.0, t["total"]), t
    assert t["forward"] > 0 and t["backward"] > 0 and t["optimizer"] > 0, t
    assert t["optimizer"] + t["reduce_wait"] <= t["step"] * 1.01 + 0.05, t
    # 5 steps per line: the split cannot exceed the run's wall time
    assert 5 * t["total"] / 1000 <= wall, (t, wall)
print("step split:", on[-1]["time_ms"])
PY

# 7. zero3-bench train runs its matrix (world sizes 1 and 2, with and without offload) on the tiny job,
# through the zero3 program beside it (both are built into bin/).
"$zero3_bench" train --config "$configs/gpt-tiny-offload.json" --world-sizes 1,2 --steps 2 --json \
  --mpirun "$mpiexec" >"$tmp/bench.json" 2>"$tmp/bench.err" || fail "bench train failed: $(tail -n 8 "$tmp/bench.err")"
python3 - "$tmp/bench.json" <<'PY' || fail "bench train JSON"
import json, sys
r = json.load(open(sys.argv[1]))["results"]
assert [(c["world_size"], c["offload_optimizer"]) for c in r] == [(1, False), (1, True), (2, False), (2, True)], r
for c in r:
    assert c["tokens_per_s"] > 0 and c["time_ms"]["total"] > 0, c
print("bench train:", [(c["world_size"], c["offload_optimizer"], round(c["tokens_per_s"])) for c in r])
PY

# 8. stage3_gather_16bit_weights_on_model_save: every checkpoint holds model.safetensors, byte for byte what
# `zero3 ckpt export --dtype bf16` writes from the same checkpoint (the HF Trainer's 16-bit model file).
python3 - "$configs/mlp-tiny.json" "$tmp/gather.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
open(sys.argv[2], "w").write(json.dumps(c))
PY
"$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/gather.json" --steps 20 \
  --save-dir "$tmp/gather" --save-interval 10 >"$tmp/gather.out" 2>&1 ||
  fail "gather run failed: $(tail -n 5 "$tmp/gather.out")"
for tag in global_step10 global_step20; do
  if [[ ! -s "$tmp/gather/$tag/model.safetensors" ]]; then
    fail "$tag has no model.safetensors"
    continue
  fi
  "$zero3" ckpt export "$tmp/gather/$tag" --out "$tmp/$tag.safetensors" --dtype bf16 >/dev/null 2>&1 ||
    fail "ckpt export of $tag failed"
  cmp -s "$tmp/gather/$tag/model.safetensors" "$tmp/$tag.safetensors" || fail "$tag/model.safetensors differs from the export"
done
"$zero3" ckpt info "$tmp/gather" >/dev/null 2>&1 || fail "the checkpoint with model.safetensors does not verify"

finish "train CLI: all checks passed"
