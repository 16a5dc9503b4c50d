#!/usr/bin/env python3
"""Read a TensorBoard log directory zero3 wrote and check it against the run's JSONL metrics.

usage: check_tensorboard.py LOGDIR METRICS_JSONL STEPS SAMPLES_PER_STEP FP16(0|1)

Decodes every event file twice: with a reader written here from the TFRecord and protobuf specifications
(length + masked CRC-32C framing, Event / Summary / Value fields), always; and with the tensorboard
package's own event reader (EventAccumulator); without that package it exits 77 (skipped, tests/support/skip.py)
after the first reader's checks. Checks:
every CRC; the file_version record; one train_loss and lr value per step (and loss_scale with fp16) at
x = samples so far; the log-line scalars equal the JSONL figures (to float32 precision); memory scalars present.
"""
import glob
import json
import math
import os
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from skip import skip  # noqa: E402


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of a protobuf message: varints as ints, fixed as bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        yield field, wire, value


def read_events(path):
    data = open(path, "rb").read()
    i, events = 0, []
    while i < len(data):
        header = data[i : i + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[i + 8 : i + 12])
        assert length_crc == masked(crc32c(header)), f"{path}: bad length CRC at byte {i}"
        payload = data[i + 12 : i + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[i + 12 + length : i + 16 + length])
        assert payload_crc == masked(crc32c(payload)), f"{path}: bad payload CRC at byte {i}"
        i += 16 + length
        event = {"scalars": {}}
        for field, _, value in fields(payload):
            if field == 1:
                event["wall_time"] = struct.unpack("<d", value)[0]
            elif field == 2:
                event["step"] = value
            elif field == 3:
                event["file_version"] = value.decode()
            elif field == 5:
                for f, _, v in fields(value):
                    assert f == 1
                    parts = {ff: vv for ff, _, vv in fields(v)}
                    event["scalars"][parts[1].decode()] = struct.unpack("<f", parts[2])[0]
        events.append(event)
    return events


def close(a, b):
    return math.isclose(a, b, rel_tol=2e-7, abs_tol=1e-30) or (math.isnan(a) and math.isnan(b))


def as_float32(value):
    """A JSONL figure as the float32 an event holds (JSON writes a non-finite number as null)."""
    if value is None:
        return float("nan")
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def main():
    logdir, metrics, steps, per_step, fp16 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file in {logdir}, found {files}"
    events = read_events(files[0])
    assert events[0].get("file_version") == "brain.Event:2", events[0]
    series = {}
    for e in events[1:]:
        for tag, value in e["scalars"].items():
            series.setdefault(tag, []).append((e["step"], value))
    xs = [per_step * (s + 1) for s in range(steps)]
    for tag in ["Train/Samples/train_loss", "Train/Samples/lr"] + (["Train/Samples/loss_scale"] if fp16 else []):
        assert [x for x, _ in series.get(tag, [])] == xs, f"{tag}: x values {series.get(tag)} != {xs}"
    assert fp16 or "Train/Samples/loss_scale" not in series
    records = [json.loads(line) for line in open(metrics) if line.strip()]
    for name, key in [("heldout_loss", "heldout_loss"), ("grad_norm", "grad_norm"),
                      ("skipped_steps", "skipped_steps"), ("tokens_per_s", "tokens_per_s")]:
        got = series.get("Train/Samples/" + name, [])
        assert len(got) == len(records), f"{name}: {len(got)} values for {len(records)} log lines"
        for (x, value), record in zip(got, records):
            assert x == per_step * record["step"], (name, x, record["step"])
            assert close(value, as_float32(record[key])), (name, value, record[key])
    lr_at = dict(series["Train/Samples/lr"])
    for record in records:
        assert close(lr_at[per_step * record["step"]], as_float32(record["lr"]))
    memory = [t for t in series if t.startswith("Memory/device/")]
    assert any(t.endswith("param_shard_peak_MiB") for t in memory), memory
    print(f"check_tensorboard: {len(events)} records, {len(series)} tags, CRCs and values agree")

    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        skip("check_tensorboard: the tensorboard package is not installed (tools/test.sh installs it): its reader "
             "did not read the event file")
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == set(series), f"tensorboard reads tags {sorted(tags)}, expected {sorted(series)}"
    for tag, values in series.items():
        read = [(s.step, s.value) for s in acc.Scalars(tag)]
        assert len(read) == len(values) and all(a[0] == b[0] and close(a[1], b[1]) for a, b in zip(read, values)), tag
    print(f"check_tensorboard: the tensorboard package's reader agrees on all {len(tags)} tags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
