#!/usr/bin/env bash
# zero3's fused CPU AdamW next to torch.optim.AdamW at the same sizes and thread count, in one table.
# Usage: tools/bench/cpu_optimizer_vs_torch.sh [ZERO3_BENCH_BINARY] [-- extra `zero3-bench cpu-optimizer` args]
# The binary defaults to build/bin/zero3-bench. Without torch (python3 from PATH) the zero3 table comes alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
zero3_bench="${1:-build/bin/zero3-bench}"
shift || true
[[ "${1:-}" == "--" ]] && shift
params="${PARAMS:-10M,100M,1B}"
threads="${THREADS:-0}"

torch_json="$(mktemp)"
trap 'rm -f "$torch_json"' EXIT
python3 "$here/../python/torch_adamw.py" --params "$params" --threads "$threads" --json >"$torch_json"
if python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["results"] else 1)' "$torch_json"; then
  "$zero3_bench" cpu-optimizer --params "$params" --threads "$threads" --torch-json "$torch_json" "$@"
  exit
fi
"$zero3_bench" cpu-optimizer --params "$params" --threads "$threads" "$@"
