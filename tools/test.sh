#!/usr/bin/env bash
# Installs the dependencies (and the Python packages the tests read files with), builds, and runs every
# test (unit, MPI at world sizes 1-4; GPU tests are skipped without a device). `tools/test.sh tsan` runs
# the host-backend and communicator tests under ThreadSanitizer; `tools/test.sh asan` runs all tests under
# AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
tools/install-deps.sh
# The Python packages the tests read zero3's files with (numpy and safetensors: the safetensors export and the
# Hugging Face Llama test; tensorboard: its event reader) and the scripts under tools/python import, from
# tools/python/requirements.txt. Without them those tests would only report skipped.
if ! python3 -c "import numpy, safetensors, tensorboard, tokenizers, hjson" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r tools/python/requirements.txt
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
