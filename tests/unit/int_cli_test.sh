#!/usr/bin/env bash
# `zero3 train` with model sizes past a 32-bit int or past any memory, as a user would give them on the command
# line: each is refused as a config error (exit status 2) within seconds, naming the key and the value (or the
# model that does not fit), never building a wrapped model or failing to allocate. A checkpoint whose manifest
# holds counters or trainer state past their ranges is refused on resume, naming the field.
# usage: int_cli_test.sh ZERO3 CONFIGS_DIR
set -u
zero3=$1
configs=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
cfg=$configs/gpt-tiny-offload.json

# refused NAME EXPECTED_TEXT ARGS...: the run exits with status 2 in under 30 s, its output holds EXPECTED_TEXT
# and no bad_alloc.
refused() {
  local name=$1 expected=$2
  shift 2
  local out=$tmp/$name.out status
  timeout 30 "$zero3" train --config "$cfg" --steps 1 --progress off --run-dir "$tmp/run" "$@" >"$out" 2>&1
  status=$?
  [[ $status -eq 2 ]] || fail "$name: exit status $status, expected 2: $(tail -3 "$out")"
  grep -qF -- "$expected" "$out" || fail "$name: no '$expected' in: $(tail -3 "$out")"
  if grep -q "bad_alloc" "$out"; then fail "$name: bad_alloc"; fi
  [[ $status -eq 2 ]] && echo "ok: $name: $(grep -m1 -F -- "$expected" "$out")"
}

refused layers_2p32_plus_1 "zero3.model.layers: 4294967297 is out of range (1 .. 2147483647, a 32-bit integer)" \
  --model.layers 4294967297
refused hidden_2p32_plus_64 "zero3.model.hidden_size: 4294967360 is out of range (1 .. 2147483647, a 32-bit integer)" \
  --model.hidden_size 4294967360
refused layers_2p32 "zero3.model.layers: 4294967296 is out of range (1 .. 2147483647, a 32-bit integer)" \
  --model.layers 4294967296
refused layers_fraction "zero3.model.layers: expected an integer > 0, got 1.5 (a fractional number)" \
  --model.layers 1.5
refused layers_negative "zero3.model.layers: must be > 0, got -1" --model.layers -1
# 10^8 layers fit an int: the memory check refuses the model before it declares a unit.
refused layers_1e8 "memory: the model does not fit" --model.layers 100000000
refused layers_1e8_float "memory: the model does not fit" --model.layers 1e8

# A checkpoint whose counters or trainer state were edited past their ranges: the resume fails (non-zero, in
# under 60 s) with an error naming the manifest and the field, never a JSON library error or a wrapped count.
timeout 60 "$zero3" train --config "$cfg" --steps 2 --progress off --run-dir "$tmp/run" --save-dir "$tmp/ck" \
  >"$tmp/ck.out" 2>&1 || fail "checkpoint for the edits: $(tail -3 "$tmp/ck.out")"
# edited NAME EXPECTED_TEXT PYTHON_EDIT: PYTHON_EDIT changes `m` (the manifest of a copy of the checkpoint).
edited() {
  local name=$1 expected=$2 edit=$3
  local dir=$tmp/edit-$name out=$tmp/edit-$name.out status
  cp -r "$tmp/ck/global_step2" "$dir"
  python3 - "$dir/manifest.json" "$edit" <<'PY'
import json, sys
path, edit = sys.argv[1], sys.argv[2]
m = json.load(open(path))
exec(edit)
json.dump(m, open(path, "w"))
PY
  timeout 60 "$zero3" train --config "$cfg" --steps 4 --progress off --run-dir "$tmp/run" --resume "$dir" \
    >"$out" 2>&1
  status=$?
  [[ $status -ne 0 && $status -ne 124 ]] || fail "$name: exit status $status: $(tail -3 "$out")"
  grep -qF -- "$dir/manifest.json: field $expected" "$out" || fail "$name: no '$expected' in: $(tail -3 "$out")"
  if grep -q "json.exception" "$out"; then fail "$name: a JSON library error: $(grep -m1 json.exception "$out")"; fi
  [[ $status -ne 0 ]] && echo "ok: $name: $(grep -m1 -F -- "$expected" "$out")"
}
edited step_fraction "state.engine.global_step: expected an integer (at least 0), got 1.5" \
  'm["state"]["engine"]["global_step"] = 1.5'
edited step_2p63 "state.engine.global_step: expected an integer (at least 0), got 9223372036854775808" \
  'm["state"]["engine"]["global_step"] = 2**63'
edited lr_negative "state.engine.lr_iteration: -3 is out of range (at least -1)" \
  'm["state"]["engine"]["lr_iteration"] = -3'
edited data_offset_negative "state.trainer.step_guard.data_offset: -5 is out of range (0 .. 4611686018427387903)" \
  'm["state"]["trainer"]["step_guard"]["data_offset"] = -5'
edited spikes_string "state.trainer.step_guard.consecutive_spikes: expected an integer (at least 0), got \"2\"" \
  'm["state"]["trainer"]["step_guard"]["consecutive_spikes"] = "2"'
edited window_null "state.trainer.step_guard.detector.window[1]: expected a finite number, got null" \
  'm["state"]["trainer"]["step_guard"]["detector"]["window"] = [1.0, None]'
edited manifest_step "step: -1 is out of range (at least 0)" 'm["step"] = -1'

finish "int_cli: all passed"
