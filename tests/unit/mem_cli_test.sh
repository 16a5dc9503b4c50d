#!/usr/bin/env bash
# `zero3 mem plan` and `zero3 mem fit` on configs/gpt-small.json: the plan's JSON has the --memory-json shape
# (every kind and category, for every rank) and the DeepSpeed estimate; model states halve from one rank to
# two; fit says a roomy device fits, and for a small one lists only settings whose plan fits, cheapest first,
# or fails with a message when nothing can fit; at the SmolLM-135M shape and context 8192 checkpointing lowers the
# planned activations and fit proposes it.
# usage: mem_cli_test.sh ZERO3 CONFIGS_DIR
set -u
zero3=$1
configs=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
cfg=$configs/gpt-small.json

"$zero3" mem plan --config "$cfg" --world-size 1 --json >"$tmp/p1.json" || fail "mem plan --world-size 1 failed"
"$zero3" mem plan --config "$cfg" --world-size 2 --json >"$tmp/p2.json" || fail "mem plan --world-size 2 failed"
python3 - "$tmp/p1.json" "$tmp/p2.json" <<'PY' || fail "the plan's JSON"
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
kinds = {"device", "pinned_host", "pageable_host"}
cats = {"param_shard", "param_gathered", "grad_buffer", "grad_shard", "master", "optim_state", "comm_buffer",
        "staging", "activations", "workspace"}
for plan, n in ((one, 1), (two, 2)):
    assert [r["rank"] for r in plan["ranks"]] == list(range(n)), plan["ranks"]
    for r in plan["ranks"]:
        assert set(r["peak_bytes"]) == kinds and all(set(r["peak_bytes"][k]) == cats for k in kinds), r
    ds = plan["deepspeed_estimate"]
    assert ds["covered"] and ds["total_params"] == 4240896, ds
# gpt-small offloads its optimizer: the master moves to pinned host memory and halves with two ranks.
m1 = one["ranks"][0]["peak_bytes"]["pinned_host"]["master"]
m2 = two["ranks"][0]["peak_bytes"]["pinned_host"]["master"]
assert m1 > 0 and abs(m2 - m1 / 2) <= 6 * 64 * 4, (m1, m2)
print("plan json ok: master", m1, "->", m2, "bytes")
PY
"$zero3" mem plan --config "$cfg" --world-size 2 | grep -q "DeepSpeed's estimate_zero3_model_states_mem_needs_all_live" ||
  fail "mem plan's table has no DeepSpeed estimate"

out=$("$zero3" mem fit --config "$cfg" --world-size 2 --device-memory-gb 64)
[ $? -eq 0 ] && grep -q "it fits" <<<"$out" || fail "mem fit on a roomy device: $out"
out=$("$zero3" mem fit --config "$cfg" --world-size 2 --device-memory-gb 0.1 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
  grep -q "it does not fit" <<<"$out" || fail "mem fit on a small device did not say so: $out"
  python3 - <<PY || fail "mem fit's list: $out"
import re
rows = [l for l in """$out""".splitlines() if re.search(r"GiB  \+", l)]
assert rows, "no candidates"
gib = [float(re.search(r"([0-9.]+) GiB  \+", l).group(1)) for l in rows]
ms = [float(re.search(r"\+([0-9.]+) ms/step", l).group(1)) for l in rows]
assert all(g <= 0.1 for g in gib), gib
assert ms == sorted(ms), ms
print("fit ok:", len(rows), "settings fit")
PY
else
  grep -q "nothing tried fits" <<<"$out" || fail "mem fit failed without saying why (rc $rc): $out"
fi
"$zero3" mem fit --config "$cfg" --world-size 2 --device-memory-gb 0.000001 >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "nothing tried fits" "$tmp/err" || fail "mem fit with no room: $(cat "$tmp/err")"

# Host memory too: the SmolLM-135M shape with its optimizer offloaded needs about 2 GiB of host memory per node
# at 2 ranks (16 bytes per param); with 1.5 GiB, fit proposes the state on NVMe, every proposal within both
# budgets.
out=$("$zero3" mem fit --config "$configs/smollm-135m.json" --world-size 2 --heldout-samples 1 --device-memory-gb 8 \
  --host-memory-gb 1.5 2>&1)
grep -q "it does not fit" <<<"$out" && grep -q "state on NVMe" <<<"$out" ||
  fail "mem fit with too little host memory proposes no NVMe offload: $out"
python3 - <<PY || fail "mem fit's list with a host budget: $out"
import re
rows = [l for l in """$out""".splitlines() if re.search(r"GiB/node  \+", l)]
assert rows, "no candidates"
host = [float(re.search(r"host ([0-9.]+) GiB/node", l).group(1)) for l in rows]
dev = [float(re.search(r"([0-9.]+) GiB  host", l).group(1)) for l in rows]
assert all(h <= 1.5 for h in host) and all(d <= 8 for d in dev), (host, dev)
print("fit with a host budget ok:", len(rows), "settings fit")
PY

# With the params too large for host memory as well: the 2.45B Llama (bf16 param shards 2.3 GiB per rank) on
# 5 GiB devices and 4 GiB of host memory per node: every proposal puts the params on NVMe too. (The smallest
# device footprint of this model at context 512 is about 4.2 GiB per rank, full checkpointing included, so
# 4 GiB devices fit nothing whatever the host memory.)
out=$("$zero3" mem fit --config "$configs/llama-2.5b-nvme.json" --world-size 2 --heldout-samples 1 \
  --device-memory-gb 5 --host-memory-gb 4 2>&1)
python3 - <<PY || fail "mem fit with the params too large for host memory: $out"
import re
rows = [l for l in """$out""".splitlines() if re.search(r"GiB/node  \+", l)]
assert rows, "no candidates"
assert all("state and params on NVMe" in l for l in rows), rows
host = [float(re.search(r"host ([0-9.]+) GiB/node", l).group(1)) for l in rows]
assert all(h <= 4 for h in host), host
print("fit with params on NVMe ok:", len(rows), "settings fit")
PY

# At a real context length the activations are what does not fit: the SmolLM-135M shape at context 8192 on
# 6 GiB devices. The plan falls with each checkpointing mode (none > selective > full), and fit proposes
# checkpointing, every proposal within the budget.
smol=$configs/smollm-135m.json
for mode in none selective full; do
  "$zero3" mem plan --config "$smol" --world-size 2 --model.seq_len 8192 --model.activation_checkpointing "$mode" \
    --device cuda --heldout-samples 1 --json >"$tmp/smol-$mode.json" || fail "mem plan of smollm at 8192, $mode"
done
python3 - "$tmp" <<'PY' || fail "checkpointing did not lower the planned activations"
import json, sys
def act(mode):
    r = json.load(open(f"{sys.argv[1]}/smol-{mode}.json"))["ranks"][0]
    return r["peak_bytes"]["device"]["activations"]
none, selective, full = act("none"), act("selective"), act("full")
print(f"smollm-135m at 8192, planned device activations per rank: none {none / 2**30:.2f}, "
      f"selective {selective / 2**30:.2f}, full {full / 2**30:.2f} GiB")
sys.exit(0 if none > selective > full > 0 else 1)
PY
out=$("$zero3" mem fit --config "$smol" --world-size 2 --model.seq_len 8192 --heldout-samples 1 --device-memory-gb 6 2>&1)
grep -q "it does not fit" <<<"$out" && grep -q "activation_checkpointing full" <<<"$out" ||
  fail "mem fit at context 8192 proposes no activation checkpointing: $out"

# With a micro-batch of 4 at context 2048 fit proposes checkpointing and a smaller micro-batch together, and
# the memory-driven micro-batch (zero3.accumulation).
python3 - "$smol" "$tmp/smol-micro4.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_batch_size"], c["train_micro_batch_size_per_gpu"] = 8, 4
json.dump(c, open(sys.argv[2], "w"))
PY
out=$("$zero3" mem fit --config "$tmp/smol-micro4.json" --world-size 2 --heldout-samples 2 --device-memory-gb 6 2>&1)
grep -q "activation_checkpointing full + micro-batch 2 (accumulation 2)" <<<"$out" &&
  grep -q '"accumulation": {"policy": "memory"}' <<<"$out" ||
  fail "mem fit with micro-batch 4 proposes no checkpointing with a smaller micro-batch: $out"

finish "mem plan and mem fit: all checks passed"
