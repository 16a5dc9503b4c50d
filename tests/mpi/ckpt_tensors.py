#!/usr/bin/env python3
"""Reads a zero3 checkpoint directory with nothing but its documented format (docs/checkpoints.md), as an
independent check of zero3's own reader: every (param, kind) tensor is assembled from the chunks of all
rank files, and every element must be covered exactly once.

  ckpt_tensors.py same DIR_A DIR_B [--kinds master,exp_avg,...]   exit 0 when every tensor is bitwise equal
  ckpt_tensors.py state DIR                                       print the manifest's state as JSON
"""
import json
import os
import sys


def load(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    sizes = {"fp32": 4, "bf16": 2, "fp16": 2}
    tensors = {}
    covered = {}
    for entry in manifest["files"]:
        with open(os.path.join(directory, entry["name"]), "rb") as f:
            data = f.read()
        for c in entry["chunks"]:
            key = (c["param"], c["kind"])
            width = sizes[c["dtype"]]
            numel = 1
            for p in manifest["params"]:
                if p["name"] == c["param"]:
                    for extent in p["shape"]:
                        numel *= extent
            buf = tensors.setdefault(key, bytearray(numel * width))
            mask = covered.setdefault(key, bytearray(numel))
            raw = data[c["offset"]: c["offset"] + c["count"] * width]
            assert len(raw) == c["count"] * width, f"{entry['name']}: short chunk {c}"
            buf[c["first"] * width: (c["first"] + c["count"]) * width] = raw
            for i in range(c["first"], c["first"] + c["count"]):
                assert mask[i] == 0, f"{key} element {i} written twice"
                mask[i] = 1
    for key, mask in covered.items():
        assert all(mask), f"{key}: not every element is in the checkpoint"
    return manifest, tensors


def main():
    if sys.argv[1] == "state":
        manifest, _ = load(sys.argv[2])
        print(json.dumps(manifest["state"], sort_keys=True))
        return 0
    kinds = None
    if "--kinds" in sys.argv:
        kinds = set(sys.argv[sys.argv.index("--kinds") + 1].split(","))
    _, a = load(sys.argv[2])
    _, b = load(sys.argv[3])
    keys_a = {k for k in a if kinds is None or k[1] in kinds}
    keys_b = {k for k in b if kinds is None or k[1] in kinds}
    if keys_a != keys_b:
        print(f"different tensors: {sorted(keys_a ^ keys_b)[:5]}")
        return 1
    bad = [k for k in sorted(keys_a) if a[k] != b[k]]
    if bad:
        print(f"{len(bad)} of {len(keys_a)} tensors differ, e.g. {bad[:3]}")
        return 1
    print(f"{len(keys_a)} tensors bitwise equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
