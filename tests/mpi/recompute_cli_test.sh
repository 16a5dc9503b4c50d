#!/usr/bin/env bash
# Activation checkpointing through `zero3 train`: each mode (full, selective, and full with the kept inputs in
# host memory: DeepSpeed's activation_checkpointing.cpu_checkpointing) trains to bitwise the same run as none,
# the same losses and gradient norms at every step and the same final checkpoint, byte for byte, for the GPT,
# the Llama and the MLP, fp32 and bf16, at world sizes 1 and 2 (the GPT also with the optimizer offloaded);
# and its peak activations are lower, the offloaded ones in host memory. Usage: recompute_cli_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [FLAGS...]
set -u
zero3="$1"
configs="$2"
mpiexec="$3"
shift 3
mpi_flags=("$@")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# The jobs: short runs of the shipped configs, fp32 variants without the bf16 block, and a small Llama on
# synthetic data with a context of two attention tiles and more.
python3 - "$configs" "$tmp" <<'PY'
import json, os, sys
configs, tmp = sys.argv[1:3]
def write(name, c):
    c["steps_per_print"] = 1
    open(os.path.join(tmp, name + ".json"), "w").write(json.dumps(c))
    c = json.loads(json.dumps(c))
    c["activation_checkpointing"] = {"cpu_checkpointing": True}
    c["zero3"]["model"]["activation_checkpointing"] = "full"
    open(os.path.join(tmp, name + "-cpu.json"), "w").write(json.dumps(c))
gpt = json.load(open(os.path.join(configs, "gpt-tiny-ondevice.json")))
write("gpt-bf16", dict(gpt))
fp32 = dict(gpt); fp32.pop("bf16", None); write("gpt-fp32", fp32)
write("gpt-offload-bf16", json.load(open(os.path.join(configs, "gpt-tiny-offload.json"))))
mlp = json.load(open(os.path.join(configs, "mlp-tiny.json")))
write("mlp-bf16", mlp)
llama = json.load(open(os.path.join(configs, "llama-bytes.json")))
llama["train_batch_size"], llama["train_micro_batch_size_per_gpu"] = 4, 2
llama["zero3"]["model"].update({"layers": 4, "hidden_size": 64, "heads": 4, "kv_heads": 2, "intermediate_size": 96,
                                "vocab_size": 64, "seq_len": 160})
llama["zero3"]["data"] = {"source": "synthetic:markov", "markov_order": 2}
write("llama-bf16", dict(llama))
l32 = dict(llama); l32.pop("bf16", None); write("llama-fp32", l32)
PY

run() {  # job np mode (full-cpu: full with cpu_checkpointing)
  local out="$tmp/$1-np$2-$3" config="$tmp/$1.json" mode="$3"
  [[ "$3" == full-cpu ]] && config="$tmp/$1-cpu.json" mode=full
  local launch=()
  [[ "$2" -gt 1 ]] && launch=("$mpiexec" "${mpi_flags[@]}" -np "$2")
  "${launch[@]}" "$zero3" train --progress off --config "$config" --steps 4 --log-interval 1 --heldout-samples 2 \
    --model.activation_checkpointing "$mode" --metrics "$out.jsonl" --memory-json "$out.mem.json" --save-dir "$out.ckpt" \
    --save-mode sync >"$out.out" 2>&1 || {
    fail "$1 at np $2 with $3 failed: $(tail -n 3 "$out.out")"
    return 1
  }
}

same_run() {  # job np mode: the run equals the run with none
  local a="$tmp/$1-np$2-none" b="$tmp/$1-np$2-$3"
  python3 - "$a.jsonl" "$b.jsonl" <<'PY' || fail "$1 at np $2: $3 logs other losses than none"
import json, sys
def curve(p):
    return [(r["step"], r["loss"], r["heldout_loss"], r["grad_norm"]) for r in map(json.loads, open(p))]
a, b = curve(sys.argv[1]), curve(sys.argv[2])
assert len(a) == 4 and a == b, f"{a}\n{b}"
PY
  local files=0
  while IFS= read -r f; do
    files=$((files + 1))
    cmp -s "$a.ckpt/$f" "$b.ckpt/$f" || fail "$1 at np $2: $3's checkpoint file $f differs from none's"
  done < <(cd "$a.ckpt" && find . -type f -name "*.bin" -o -type f -name "*.safetensors" | sort)
  [[ "$files" -gt 0 ]] || fail "$1 at np $2: no checkpoint files to compare"
}

for job in gpt-fp32 gpt-bf16 gpt-offload-bf16 llama-fp32 llama-bf16 mlp-bf16; do
  for np in 1 2; do
    run "$job" "$np" none || continue
    for mode in full selective full-cpu; do
      run "$job" "$np" "$mode" && same_run "$job" "$np" "$mode"
    done
  done
done

# Less kept means a lower peak: the measured activations category (device memory of the host device) of full
# and selective below none's, full the lowest (Llama, np 1).
python3 - "$tmp/llama-fp32-np1" <<'PY' || fail "recomputation did not lower the measured activations"
import json, sys
def activations(mode):
    rank = json.load(open(f"{sys.argv[1]}-{mode}.mem.json"))["ranks"][0]
    return sum(kinds.get("activations", 0) for kinds in rank["peak_bytes"].values())
none, full, selective = (activations(m) for m in ("none", "full", "selective"))
print(f"llama-fp32 activations: none {none}, selective {selective}, full {full} bytes")
sys.exit(0 if full < selective < none else 1)
PY
# cpu_checkpointing moves full's kept inputs out of the device's activations into host memory (the host device's
# staging memory is pageable).
python3 - "$tmp/llama-fp32-np1" <<'PY' || fail "cpu_checkpointing did not move the kept inputs to host memory"
import json, sys
def peaks(mode):
    p = json.load(open(f"{sys.argv[1]}-{mode}.mem.json"))["ranks"][0]["peak_bytes"]
    return p["device"].get("activations", 0), p["pageable_host"].get("activations", 0)
full, cpu = peaks("full"), peaks("full-cpu")
print(f"llama-fp32 full activations (device, host): {full}; with cpu_checkpointing: {cpu}")
sys.exit(0 if cpu[0] < full[0] and cpu[1] > 0 and full[1] == 0 else 1)
PY

echo "recompute_cli_test: $failures failure(s)"
[[ "$failures" -eq 0 ]]
