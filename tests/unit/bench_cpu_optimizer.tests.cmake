# `zero3-bench cpu-optimizer`: the shape of its --json output for each optimizer at a size that is no
# multiple of a tile or a vector (timings are not checked), and a clear failure for an unknown optimizer.
if(TARGET zero3-bench)
  set(zero3_bench_cpu_optimizer_check [=[
import json, sys
doc = json.loads(sys.stdin.read())
assert isinstance(doc, dict) and isinstance(doc.get("results"), list), doc
assert len(doc["results"]) == 1, doc["results"]
r = doc["results"][0]
for key in ("params", "threads", "bound_gbps", "fused_gbps", "unfused_gbps", "fused_gparams_per_s",
            "fused_over_bound", "fused_over_unfused"):
    assert key in r, f"missing {key}: {r}"
assert r["params"] == 100003 and isinstance(r["params"], int), r
assert isinstance(r["threads"], int) and r["threads"] >= 1, r
for key in ("bound_gbps", "fused_gbps", "unfused_gbps", "fused_gparams_per_s", "fused_over_bound",
            "fused_over_unfused"):
    assert isinstance(r[key], (int, float)) and r[key] > 0, f"{key}: {r[key]}"
assert r["optimizer"] == sys.argv[1], r
]=])
  add_test(NAME unit.bench_cpu_optimizer_json
           COMMAND bash -c [=[
set -e
for opt in adamw adam lion adagrad
do
  out="$("$1" cpu-optimizer --params 100003 --repeats 1 --json --optimizer "$opt")"
  printf '%s' "$out" | python3 -c "$2" "$opt"
done
]=] bench_cpu_optimizer $<TARGET_FILE:zero3-bench> "${zero3_bench_cpu_optimizer_check}")
  set_tests_properties(unit.bench_cpu_optimizer_json PROPERTIES LABELS "unit" TIMEOUT 120)

  add_test(NAME unit.bench_cpu_optimizer_bad_optimizer
           COMMAND bash -c [=[
if err="$("$1" cpu-optimizer --params 1000 --optimizer sgd 2>&1 >/dev/null)"
then
  echo "exit status 0 for --optimizer sgd"
  exit 1
fi
if ! printf '%s' "$err" | grep -q -- "--optimizer: sgd not in"
then
  echo "unexpected message: $err"
  exit 1
fi
]=] bench_cpu_optimizer $<TARGET_FILE:zero3-bench>)
  set_tests_properties(unit.bench_cpu_optimizer_bad_optimizer PROPERTIES LABELS "unit" TIMEOUT 60)
endif()
