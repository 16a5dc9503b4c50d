#!/usr/bin/env bash
# The peers of tools/bench/peers/run.py in a virtual environment outside the repository:
# torch 2.15.0 (CPU wheels), deepspeed 0.19.8 (built against that torch), numpy, hjson.
# Usage: tools/bench/peers/setup.sh [VENV]   (default ${ZERO3_PEERS_VENV:-$HOME/.cache/zero3-peers-venv})
# Idempotent: an environment that already imports the pinned versions is left as it is.
set -euo pipefail

venv="${1:-${ZERO3_PEERS_VENV:-$HOME/.cache/zero3-peers-venv}}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
case "$(realpath -m "$venv")/" in
  "$repo"/*) echo "setup.sh: $venv is inside the repository; pick a path outside it" >&2; exit 2 ;;
esac

torch_version=2.15.0
deepspeed_version=0.19.8
python="$venv/bin/python"

have_pins() {
  [[ -x "$python" ]] && DS_ACCELERATOR=cpu "$python" - "$torch_version" "$deepspeed_version" <<'PY' 2>/dev/null
import sys
import torch, deepspeed, numpy, hjson
ok = torch.__version__.split("+")[0] == sys.argv[1] and deepspeed.__version__ == sys.argv[2]
sys.exit(0 if ok else 1)
PY
}

if have_pins; then
  echo "setup.sh: $venv already has torch $torch_version and deepspeed $deepspeed_version"
else
  [[ -x "$python" ]] || python3 -m venv "$venv"
  "$python" -m pip install --upgrade pip wheel setuptools
  # The CPU wheels: no CUDA runtime to download on a machine that has no GPU to use it.
  "$python" -m pip install "torch==$torch_version" --index-url https://download.pytorch.org/whl/cpu ||
    "$python" -m pip install "torch==$torch_version"
  "$python" -m pip install numpy hjson ninja py-cpuinfo psutil
  # DeepSpeed's setup.py imports torch: build it against the torch just installed, not an isolated one.
  "$python" -m pip install --no-build-isolation "deepspeed==$deepspeed_version"
  have_pins || { echo "setup.sh: $venv still cannot import the pinned torch and deepspeed" >&2; exit 1; }
fi
echo "run the benchmark with: python tools/bench/peers/run.py --python $python --zero3 build-host/bin/zero3"
