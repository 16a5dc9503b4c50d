#!/usr/bin/env bash
# The peers of tools/python/peers/run.py in a virtual environment outside the repository:
# tools/python/requirements-peers.txt, with its torch from the CPU wheels and its deepspeed built against it.
# Usage: tools/python/peers/setup.sh [VENV]   (default ${ZERO3_PEERS_VENV:-$HOME/.cache/zero3-peers-venv})
# Idempotent: an environment that already imports the pinned versions is left as it is.
# System package (not installed here; it needs root): DeepSpeed's NVMe offload (run.py --only nvme) JIT-builds
# its async_io op against libaio, Debian's libaio-dev (apt-get install -y libaio-dev); without it that
# contestant fails ("Unable to JIT load the async_io op ..."), the rest of the benchmark does not need it.
set -euo pipefail

venv="${1:-${ZERO3_PEERS_VENV:-$HOME/.cache/zero3-peers-venv}}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
case "$(realpath -m "$venv")/" in
  "$repo"/*) echo "setup.sh: $venv is inside the repository; pick a path outside it" >&2; exit 2 ;;
esac

requirements="$repo/tools/python/requirements-peers.txt"
pin() { sed -n "s/^$1==//p" "$requirements"; }
torch_version="$(pin torch)"
deepspeed_version="$(pin deepspeed)"
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
  # DeepSpeed's setup.py imports torch: build it against the torch just installed, not an isolated one.
  "$python" -m pip install --no-build-isolation -r "$requirements"
  have_pins || { echo "setup.sh: $venv still cannot import the pinned torch and deepspeed" >&2; exit 1; }
fi
# DeepSpeed's own check (AsyncIOBuilder.is_compatible: compile and link a call to io_submit with -laio).
if ! DS_ACCELERATOR=cpu "$python" -c 'from deepspeed.ops.op_builder import AsyncIOBuilder as B; import sys
sys.exit(0 if B().is_compatible() else 1)' >/dev/null 2>&1; then
  echo "setup.sh: note: DeepSpeed's async_io op cannot build here (libaio headers missing); run.py --only nvme" \
       "needs them for DeepSpeed's side: apt-get install -y libaio-dev"
fi
echo "run the benchmark with: python tools/python/peers/run.py --python $python --zero3 build-host/bin/zero3"
