#!/usr/bin/env bash
# `zero3 ckpt info` and `zero3 ckpt export` end to end: info exits 0 on a good checkpoint and 2 naming the
# file once a byte of it is changed (and 2 for a path that is not a checkpoint); the export, fp32 and bf16,
# read back by Python's safetensors (names, shapes, dtypes, metadata, values bit for bit); and the peak
# RSS of exporting a checkpoint far larger than kChunkBytes grows by less than 64 MB over a tiny one.
# Usage: ckpt_export_safetensors.sh ZERO3_BINARY MAKE_TEST_CHECKPOINT
# Exit 77 (skipped, tests/support/skip.sh) when Python's safetensors or numpy is missing, after the checks that
# need neither.
# ZERO3_PYTHON picks the interpreter (default python3).
set -u
source "$(dirname "$0")/../support/skip.sh"
zero3="$1"
helper="$2"
python="${ZERO3_PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

# run EXPECTED_CODE ARGS...: runs zero3, leaves stdout/stderr in $tmp/out, $tmp/err.
run() {
  local expected="$1"
  shift
  "$zero3" "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [[ $code -ne $expected ]]; then
    fail "zero3 $*: exit $code, expected $expected"
    sed 's/^/    /' "$tmp/err"
    return 1
  fi
  return 0
}

expect_in() {
  local file="$1" needle="$2"
  grep -qF -- "$needle" "$tmp/$file" || { fail "$file lacks: $needle"; sed 's/^/    /' "$tmp/$file"; }
}

root="$tmp/root"
"$helper" small "$root" "$tmp/expected" || { echo "FAIL: make_test_checkpoint small"; exit 1; }
ckpt="$root/global_step5"

# info on the root (through latest), on the directory, by tag, as JSON.
if run 0 ckpt info "$root"; then
  expect_in out "tag         global_step5"
  expect_in out "step        5"
  expect_in out "world size  2"
  expect_in out "params      5 ("
  expect_in out "rank_00001.bin"
  expect_in out "checksums   ok"
fi
run 0 ckpt info "$ckpt" && expect_in out "checkpoint  $ckpt"
run 0 ckpt info "$root" --tag global_step5 --json && expect_in out '"verified": true'
run 2 ckpt info "$root" --tag nope && expect_in err "error: tag nope does not exist in $root"
mkdir "$tmp/empty"
run 2 ckpt info "$tmp/empty" && expect_in err "error: no checkpoint at $tmp/empty (no manifest.json and no latest)"

# One byte of rank 1's file changed: exit 2 naming the file.
cp -r "$root" "$tmp/corrupt"
file="$tmp/corrupt/global_step5/rank_00001.bin"
offset=1000
byte=$(od -An -tu1 -j"$offset" -N1 "$file" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte ^ 0x10) & 0xff)))" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
run 2 ckpt info "$tmp/corrupt" && expect_in err "error: $file: checksum mismatch"
rm "$tmp/corrupt/global_step5/rank_00000.bin"
run 2 ckpt info "$tmp/corrupt" &&
  expect_in err "error: $tmp/corrupt/global_step5/rank_00000.bin: cannot open: No such file or directory"

# The exports.
run 0 ckpt export "$root" --out "$tmp/model_fp32.safetensors" && expect_in out "wrote $tmp/model_fp32.safetensors"
run 0 ckpt export "$root" --out "$tmp/model_bf16.safetensors" --dtype bf16 --tag global_step5
run 2 ckpt export "$tmp/corrupt" --out "$tmp/bad.safetensors" && expect_in err "error: "
[[ -e "$tmp/bad.safetensors" || -e "$tmp/bad.safetensors.tmp" ]] && fail "a failed export left a file behind"

# Peak memory of exporting a checkpoint far larger than kChunkBytes (4 MiB): 200 MB of fp32 masters,
# 300 MB of checkpoint in all, against the same program exporting the small checkpoint above. The
# difference is what the export itself holds; the baseline is the program's own (a CUDA build maps
# cuBLAS and NCCL at start, a couple of hundred MB of RSS before any work).
peak_rss_kb() {  # peak_rss_kb ARGS...: runs zero3 ARGS, sets rss_kb
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f %M -o "$tmp/rss" "$zero3" "$@" >/dev/null || return 1
    rss_kb=$(tail -n1 "$tmp/rss")
  else
    # No GNU time: sample VmHWM (the peak so far) until the process exits.
    "$zero3" "$@" >/dev/null &
    local pid=$!
    rss_kb=0
    while kill -0 "$pid" 2>/dev/null; do
      local hwm
      hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
      [[ -n "$hwm" && "$hwm" -gt "$rss_kb" ]] && rss_kb=$hwm
      sleep 0.02
    done
    wait "$pid" || return 1
  fi
}
"$helper" big "$tmp/big" 200 || fail "make_test_checkpoint big"
limit_kb=$((64 * 1024))
peak_rss_kb ckpt export "$root" --out "$tmp/small.safetensors" || fail "export of the small checkpoint"
base_kb=$rss_kb
peak_rss_kb ckpt export "$tmp/big" --out "$tmp/big.safetensors" || fail "export of the big checkpoint"
ckpt_bytes=$(du -sb "$tmp/big/big" | cut -f1)
export_bytes=$(stat -c %s "$tmp/big.safetensors")
grown_kb=$((rss_kb - base_kb))
echo "export of a ${ckpt_bytes}-byte checkpoint (${export_bytes}-byte safetensors): peak RSS ${rss_kb} KB," \
  "${grown_kb} KB above exporting a tiny checkpoint (${base_kb} KB)"
[[ "$grown_kb" -lt "$limit_kb" ]] || fail "peak RSS grew by ${grown_kb} KB, not below ${limit_kb} KB"
[[ "$export_bytes" -gt $((200 * 1024 * 1024)) ]] || fail "big export holds only $export_bytes bytes"
rm -rf "$tmp/big" "$tmp/big.safetensors"

if ! "$python" -c "import safetensors, numpy" 2>/dev/null; then
  if [[ $failures -ne 0 ]]; then
    echo "$failures failure(s)"
    exit 1
  fi
  skip "Python's safetensors or numpy is missing ($python; tools/test.sh installs them): the export was not read back"
fi

"$python" - "$tmp" <<'EOF' || fail "the exports do not read back as written"
import json, struct, sys
import numpy as np
from safetensors import safe_open

tmp = sys.argv[1]
expected = json.load(open(f"{tmp}/expected/params.json"))
names = [p["name"] for p in expected["params"]]
ok = True

def check(cond, what):
    global ok
    if not cond:
        print("mismatch:", what)
        ok = False

for dtype, st_dtype, suffix in (("fp32", "F32", "f32"), ("bf16", "BF16", "bf16")):
    path = f"{tmp}/model_{dtype}.safetensors"
    with safe_open(path, framework="numpy") as f:
        check(sorted(f.keys()) == sorted(names), f"{dtype}: keys {f.keys()}")
        check(f.metadata() == {"format": "pt", "zero3_tag": expected["tag"], "zero3_step": str(expected["step"])},
              f"{dtype}: metadata {f.metadata()}")
        for p in expected["params"]:
            s = f.get_slice(p["name"])
            check(s.get_dtype() == st_dtype, f"{dtype} {p['name']}: dtype {s.get_dtype()}")
            check(list(s.get_shape()) == p["shape"], f"{dtype} {p['name']}: shape {s.get_shape()}")
            if dtype == "fp32":
                got = f.get_tensor(p["name"])
                want = np.fromfile(f"{tmp}/expected/{p['name']}.f32", dtype="<f4").reshape(p["shape"])
                check(got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                      f"fp32 {p['name']}: values")
    # numpy has no bfloat16: the bf16 bytes are read at the offsets the header gives, as uint16 bits.
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        check(n % 8 == 0, f"{dtype}: header length {n} is not a multiple of 8")
        header = json.loads(fh.read(n))
        data = fh.read()
    offset = 0
    for name in names:  # in the manifest's order, back to back
        begin, end = header[name]["data_offsets"]
        check(begin == offset, f"{dtype} {name}: begins at {begin}, expected {offset}")
        offset = end
        if dtype == "bf16":
            got = np.frombuffer(data[begin:end], dtype="<u2")
            want = np.fromfile(f"{tmp}/expected/{name}.bf16", dtype="<u2")
            check(np.array_equal(got, want), f"bf16 {name}: values")
    check(offset == len(data), f"{dtype}: data holds {len(data)} bytes, tensors {offset}")
print("safetensors read back:", "ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
EOF

finish "all ckpt CLI checks passed"
