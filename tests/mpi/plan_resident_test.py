#!/usr/bin/env python3
"""The memory plan held against the operating system: for jobs whose planned memory is what a rank holds
(0.4 to 1.3 GiB per rank: optimizer states on the device, the optimizer offloaded to pinned memory, params
offloaded too, activations at a context of 2,048, full recomputation with cpu_checkpointing), each rank's peak
resident memory as Linux counts it (VmHWM, what ru_maxrss reports) lies within 10% of what `zero3 mem plan`
predicts before launch: this program's own resident size plus every planned byte (the host device's memory is
host memory). World sizes 1 and 2.

Usage: plan_resident_test.py ZERO3_BINARY CONFIGS_DIR MPIEXEC [FLAGS...]
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

TOLERANCE = 0.10

zero3, configs, mpiexec, *mpi_flags = sys.argv[1:]
base = json.load(open(os.path.join(configs, "gpt-tiny-ondevice.json")))
gpt = dict(type="gpt", layers=4, hidden_size=768, heads=12, vocab_size=8192, seq_len=256)
llama = dict(type="llama", layers=4, hidden_size=256, heads=4, kv_heads=2, intermediate_size=688, vocab_size=4096,
             seq_len=2048)
pinned = {"device": "cpu", "pin_memory": True}
JOBS = [  # name, model, micro-batch, fp32, zero_optimization keys, other top-level keys
    ("gpt-fp32-on-device", gpt, 4, True, {}, {}),
    ("gpt-bf16-offload-optimizer", gpt, 4, False, {"offload_optimizer": pinned}, {}),
    ("gpt-bf16-offload-param-optimizer", gpt, 4, False,
     {"offload_optimizer": pinned, "offload_param": {"device": "cpu"}}, {}),
    ("llama-bf16-context-2048", llama, 2, False, {}, {}),
    ("llama-bf16-2048-cpu-checkpointing", dict(llama, layers=6, activation_checkpointing="full"), 4, False, {},
     {"activation_checkpointing": {"cpu_checkpointing": True}}),
]


def config(tmp, name, model, micro, world, fp32, zero, extra):
    c = copy.deepcopy(base)
    c["train_batch_size"], c["train_micro_batch_size_per_gpu"] = micro * world, micro
    if fp32:
        c.pop("bf16", None)
    c["zero_optimization"].update(zero)
    c.update(extra)
    c["zero3"]["model"] = model
    c["zero3"]["data"] = {"source": "synthetic:markov", "markov_order": 1}
    path = os.path.join(tmp, f"{name}-np{world}.json")
    json.dump(c, open(path, "w"))
    return path


failures = []
mib = 2.0 ** 20
with tempfile.TemporaryDirectory() as tmp:
    for name, model, micro, fp32, zero, extra in JOBS:
        for world in (1, 2):
            cfg = config(tmp, name, model, micro, world, fp32, zero, extra)
            held = ["--heldout-samples", str(world)]
            plan = subprocess.run([zero3, "mem", "plan", "--config", cfg, "--world-size", str(world), "--json"] + held,
                                  capture_output=True, text=True)
            if plan.returncode != 0:
                failures.append(f"{name} np{world}: mem plan failed: {plan.stderr[-500:]}")
                continue
            predicted = json.loads(plan.stdout)["resident_bytes"]["peak"]
            mem = os.path.join(tmp, f"{name}-np{world}.mem.json")
            launch = [mpiexec, *mpi_flags, "-np", str(world)] if world > 1 else []
            run = subprocess.run(launch + [zero3, "train", "--progress", "off", "--config", cfg, "--steps", "2",
                                           "--memory-json", mem] + held, capture_output=True, text=True)
            if run.returncode != 0:
                failures.append(f"{name} np{world}: train failed: {run.stdout[-300:]} {run.stderr[-500:]}")
                continue
            for rank in json.load(open(mem))["ranks"]:
                measured = rank["resident_bytes"]["peak"]
                error = (measured - predicted) / measured
                line = (f"{name:36} np{world} rank {rank['rank']}: predicted {predicted / mib:8.1f} MiB, "
                        f"measured {measured / mib:8.1f} MiB ({100 * error:+.1f}%)")
                print(line)
                if abs(error) > TOLERANCE:
                    failures.append(line)
for f in failures:
    print("FAIL:", f)
print(f"plan_resident_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
