#!/usr/bin/env python3
"""zero3 side by side with its peers on the CPU: interleaved rounds, the ratio zero3/peer per round.

  python tools/python/peers/run.py --zero3 build-host/bin/zero3 --rounds 5 [--only gpt|optimizer|llama|nvme]
                                  [--config configs/gpt-small.json] [--python VENV/bin/python]
                                  [--zero3-bench build-host/bin/zero3-bench]
  python tools/python/peers/run.py --only llama [--llama-config configs/smollm-135m.json]
                                  [--contexts 2048,8192] [--modes none,full,selective]
  python tools/python/peers/run.py --only nvme [--llama-config configs/smollm-135m.json] [--contexts 256]
                                  [--nvme-path /var/tmp]

The GPT runs are `zero3 train` jobs, the optimizer runs `zero3-bench cpu-optimizer` (by default the
zero3-bench beside --zero3: both are built into the build tree's bin/). Without --only, both of these
groups run. The llama group (--only llama, never by default) trains the Llama of --llama-config at each
context and activation-checkpointing mode with zero3 and with FSDP2 and DeepSpeed (llama_peer.py), and
compares tokens/s, peak resident memory per rank and what each checkpointing mode costs. The nvme group (--only
nvme, never by default) trains the same Llama with zero3 and DeepSpeed ZeRO-3, offload_optimizer nvme (and cpu, for
reference), and adds the bytes each puts on the disk; DeepSpeed's side needs its async_io op (libaio-dev).

Each round runs every contestant once, in an order shuffled afresh each round (seeded: --seed), so that a
machine that slows down or speeds up during the run weighs on every contestant alike, and no contestant
always runs right after the same one (after a 1B-param optimizer run the kernel is still reclaiming GBs
of memory); --settle idle seconds follow each such run. At the end one table gives,
per comparison, zero3's figure over the peer's in every round, their median and range, and the median
absolute figures. The peers (torch, FSDP2, DeepSpeed) come from tools/python/peers/setup.sh's environment.
"""

import argparse
import json
import math
import mmap
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
DEFAULT_VENV = os.path.join(os.environ.get("HOME", "~"), ".cache", "zero3-peers-venv")
SIZES = {"10M": 10**7, "100M": 10**8, "1B": 10**9}
LLAMA_CONTEXTS = "2048,8192"
# The NVMe group measures the optimizer's trip to the disk: a short context keeps the forward and backward small
# next to it, and a round of the group within a few minutes on a 2-core machine.
NVME_CONTEXTS = "256"
# On the root disk (O_DIRECT), not a tmpfs /tmp: the point is the disk.
DEFAULT_NVME_PATH = "/var/tmp"
GPT_STEPS, GPT_WARMUP = 12, 4
# A Llama step at a long context takes a minute or more on a small CPU machine: fewer steps per run.
LLAMA_STEPS, LLAMA_WARMUP = 3, 1


class Failed(Exception):
    """A run that failed; output: all it printed, where the message keeps only its tail."""

    def __init__(self, message, output=""):
        super().__init__(message)
        self.output = output


def run_command(argv, timeout, env=None, cwd=REPO):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"timed out after {timeout} s: {' '.join(argv)}") from e
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise Failed(f"exit {p.returncode}: {' '.join(argv)}\n{tail}")
    return p.stdout, time.perf_counter() - t0


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def zero3_timed_rate(metrics, warmup):
    """zero3's tokens/s after the warm-up, from `zero3 train --metrics` lines, and the last loss."""
    with open(metrics) as f:
        lines = json_lines(f.read())
    timed = [x for x in lines if x["step"] > warmup]
    if not timed:
        raise Failed(f"zero3 train wrote no timed window to {metrics}")
    # Windows of equal length: the run's rate is the harmonic mean of theirs.
    return len(timed) / sum(1.0 / x["tokens_per_s"] for x in timed), timed[-1]["loss"]


# ---- contestants: each run() returns {key: figure} for the comparisons it takes part in --------------------


class Contestant:
    def __init__(self, name, run, heavy=False):
        # heavy: allocates GBs (the optimizer sizes); the next run waits --settle seconds after it.
        self.name, self.run, self.heavy = name, run, heavy


def peer_env(threads=None):
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def torchrun(python, ranks):
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]


def gpt_contestants(args, configs, info):
    """Offload at 2 ranks (vs DeepSpeed, FSDP2 CPUOffloadPolicy), no offload at 2 ranks (vs DeepSpeed, FSDP2),
    1 rank (vs plain PyTorch); the same in fp32 with --fp32."""
    steps, warmup = args.steps, args.warmup
    peer = os.path.join(HERE, "gpt_peer.py")
    cores = len(os.sched_getaffinity(0))
    contestants = []

    def zero3(key, config, ranks):
        def run():
            with tempfile.TemporaryDirectory(prefix="zero3-peers-run-") as tmp:
                metrics = os.path.join(tmp, "metrics.jsonl")
                interval = math.gcd(warmup, steps) if warmup else steps
                argv = [args.zero3, "train", "--config", config, "--steps", str(warmup + steps), "--log-interval",
                        str(interval), "--metrics", metrics, "--progress", "off", "--run-dir", tmp,
                        "--heldout-samples", "8"]
                argv = args.mpirun + ["-np", str(ranks)] + argv
                out, _ = run_command(argv, args.timeout)
                m = re.search(r"zero3 train: (.*?): (\d+) params;", out)
                if m:
                    info.setdefault("zero3_model", m.group(1))
                    info.setdefault("zero3_params", int(m.group(2)))
                rate, loss = zero3_timed_rate(metrics, warmup)
                return {key: {"tokens_per_s": rate, "loss": loss}}

        return Contestant(f"zero3 {key}", run)

    def gpt_peer(key, mode, config, ranks, extra=()):
        def run():
            argv = ([args.python] if ranks == 1 else torchrun(args.python, ranks)) + [
                peer, mode, "--config", config, "--steps", str(steps), "--warmup", str(warmup), *extra]
            out, _ = run_command(argv, args.timeout, env=peer_env(max(1, cores // ranks)))
            lines = [x for x in json_lines(out) if "tokens_per_s" in x]
            if not lines:
                raise Failed(f"{mode}: no result line in\n{out[-2000:]}")
            r = lines[-1]
            info.setdefault("peer_params", {})[key + " " + mode] = (r["params"], r["params_formula"])
            info.setdefault("peer_precision", {})[key + " " + mode] = r["precision"]
            return {key: {"tokens_per_s": r["tokens_per_s"], "loss": r["loss_last"]}}

        return Contestant(f"{mode} {key}", run)

    variants = [("", configs["offload"], configs["ondevice"])]
    if args.fp32:
        variants.append((" fp32", configs["offload_fp32"], configs["ondevice_fp32"]))
    for suffix, offload, ondevice in variants:
        contestants += [
            zero3(f"offload 2r{suffix}", offload, 2),
            gpt_peer(f"offload 2r{suffix}", "deepspeed", offload, 2),
            gpt_peer(f"offload 2r{suffix}", "fsdp2", offload, 2),
            zero3(f"2r{suffix}", ondevice, 2),
            gpt_peer(f"2r{suffix}", "deepspeed", ondevice, 2),
            gpt_peer(f"2r{suffix}", "fsdp2", ondevice, 2),
            zero3(f"1r{suffix}", ondevice, 1),
            gpt_peer(f"1r{suffix}", "torch", ondevice, 1),
        ]
    comparisons = []
    for suffix, _, _ in variants:
        dt = "fp32" if suffix else "bf16" if info["bf16"] else "fp32"
        comparisons += [
            (f"gpt offload_optimizer 2 ranks {dt}", f"zero3 offload 2r{suffix}", f"deepspeed offload 2r{suffix}",
             f"offload 2r{suffix}", "tok/s"),
            (f"gpt offload_optimizer 2 ranks {dt}", f"zero3 offload 2r{suffix}", f"fsdp2 offload 2r{suffix}",
             f"offload 2r{suffix}", "tok/s"),
            (f"gpt no offload 2 ranks {dt}", f"zero3 2r{suffix}", f"deepspeed 2r{suffix}", f"2r{suffix}", "tok/s"),
            (f"gpt no offload 2 ranks {dt}", f"zero3 2r{suffix}", f"fsdp2 2r{suffix}", f"2r{suffix}", "tok/s"),
            (f"gpt 1 rank {dt}", f"zero3 1r{suffix}", f"torch 1r{suffix}", f"1r{suffix}", "tok/s"),
        ]
    return contestants, comparisons


def optimizer_contestants(args, info):
    sizes = ",".join(args.params)
    threads = args.threads
    contestants = []

    def zero3():
        argv = [args.zero3_bench, "cpu-optimizer", "--params", sizes, "--threads", str(threads), "--repeats",
                str(args.repeats), "--json"]
        out, _ = run_command(argv, args.timeout)
        doc = json_lines(out)[-1]
        figures = {}
        for r in doc["results"]:
            figures[f"opt {r['params']}"] = {"gparams_per_s": r["fused_gparams_per_s"],
                                             "gbps28": r["fused_gparams_per_s"] * 28}
        for s in doc.get("skipped", []):
            info.setdefault("skipped", {})[f"zero3 {s['params']}"] = s["reason"]
        return figures

    def peer(variant):
        def run():
            argv = [args.python, os.path.join(HERE, "optimizer_peer.py"), "--params", sizes, "--variants", variant,
                    "--threads", str(threads), "--repeats", str(args.repeats)]
            out, _ = run_command(argv, args.timeout, env=peer_env(threads))
            figures = {}
            for r in json_lines(out):
                if "skipped" in r:
                    info.setdefault("skipped", {})[f"{variant} {r['params']}"] = r["skipped"]
                    continue
                figures[f"opt {r['params']}"] = {"gparams_per_s": r["gparams_per_s"], "gbps28": r["gbps"]}
                if "cpu_adam_load_s" in r:
                    info.setdefault("cpu_adam_load_s", []).append(r["cpu_adam_load_s"])
            return figures

        return Contestant(variant, run, heavy=True)

    contestants.append(Contestant("zero3 cpu-optimizer", zero3, heavy=True))
    for v in ("torch_fused", "torch_foreach", "ds_cpu_adam", "ds_offload"):
        contestants.append(peer(v))
    comparisons = []
    for label in args.params:
        n = SIZES.get(label.upper()) or int(float(label))
        for v in ("torch_fused", "torch_foreach", "ds_cpu_adam", "ds_offload"):
            comparisons.append((f"cpu optimizer {label}", "zero3 cpu-optimizer", v, f"opt {n}", "Gpar/s"))
    return contestants, comparisons


# ---- the llama group ------------------------------------------------------------------------------------

# Runs a command and writes, once it has exited, its exit status and the largest peak resident set size of
# the processes it started and waited for (mpirun reaps its ranks: the largest rank). A fresh process per
# measurement: RUSAGE_CHILDREN only grows over a process's life, so run.py's own would carry earlier runs.
PEAK_RSS_WRAPPER = """
import json, resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"returncode": rc, "children_maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, f)
sys.exit(0 if rc == 0 else 1)
"""

LLAMA_PEERS = ("fsdp2", "deepspeed", "deepspeed+cpu")  # deepspeed+cpu: DeepSpeed's cpu_checkpointing, full only


class Skipped(Exception):
    """A contestant that does not fit (or cannot run this variant): listed, not counted as a failure."""


def run_capture(argv, timeout, env=None):
    try:
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"timed out after {timeout} s: {' '.join(argv)}") from e


def killed_for_memory(text, returncode):
    """Whether a run ended the way one that ran out of memory does: SIGKILL (the kernel's OOM killer),
    an allocation failure reported by zero3 (std::bad_alloc) or by torch."""
    lowered = text.lower()
    return (returncode in (-9, 137) or "signal 9" in lowered or "sigkill" in lowered or "bad_alloc" in lowered
            or "out of memory" in lowered or "can't allocate memory" in lowered)


def tail_of(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def describe_llama(model):
    return (f"Llama {model['layers']} layers, hidden {model['hidden_size']}, {model['heads']} heads, "
            f"{model.get('kv_heads', model['heads'])} kv heads, intermediate {model['intermediate_size']}, "
            f"vocab {model['vocab_size']}, {'tied' if model.get('tie_word_embeddings') else 'untied'} embeddings")


def llama_key(context, mode):
    return f"llama {context} {mode}"


def run_zero3_llama(args, config, key, context, mode, info, edit=None):
    """One `mpirun -np 2 zero3 train` of the Llama job `config` at `context` and checkpointing `mode`.

    edit(job) changes a copy of the job first (a dict). Returns {key: tokens/s, the largest rank's peak RSS
    (MiB), the last loss} and zero3's stdout."""
    steps, warmup, ranks = args.steps, args.warmup, 2
    with tempfile.TemporaryDirectory(prefix="zero3-peers-run-") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        rss_file = os.path.join(tmp, "rss.json")
        interval = math.gcd(warmup, steps) if warmup else steps
        job = config
        if edit:
            with open(config) as f:
                c = json.load(f)
            edit(c)
            job = os.path.join(tmp, "job.json")
            with open(job, "w") as f:
                json.dump(c, f)
        argv = args.mpirun + ["-np", str(ranks), args.zero3, "train", "--config", job,
                              "--steps", str(warmup + steps), "--log-interval", str(interval),
                              "--metrics", metrics, "--progress", "off", "--run-dir", tmp,
                              # One held-out window per rank, the least zero3 train measures: the
                              # peers evaluate nothing, and a larger held-out batch would count its
                              # logits (windows x context x vocab floats) in zero3's peak memory.
                              "--heldout-samples", str(ranks), "--model.seq_len", str(context),
                              "--model.activation_checkpointing", mode]
        p = run_capture([sys.executable, "-c", PEAK_RSS_WRAPPER, rss_file] + argv, args.timeout)
        out = p.stdout + p.stderr
        with open(rss_file) as f:
            rss = json.load(f)
        if rss["returncode"] != 0:
            if killed_for_memory(out, rss["returncode"]):
                raise Skipped(f"out of memory (exit {rss['returncode']}): {tail_of(out, 3)}")
            raise Failed(f"exit {rss['returncode']}: {' '.join(argv)}\n{tail_of(out)}")
        m = re.search(r"zero3 train: (.*?): (\d+) params;", p.stdout)
        if m:
            info.setdefault("zero3_model", m.group(1))
            info.setdefault("zero3_params", int(m.group(2)))
        rate, loss = zero3_timed_rate(metrics, warmup)
        return {key: {"tokens_per_s": rate, "peak_rss_mib": rss["children_maxrss_kib"] / 1024.0, "loss": loss}}, out


def run_llama_peer(args, name, config, key, context, mode, info):
    """One llama_peer.py run of peer `name` (fsdp2, deepspeed, deepspeed+cpu) under torchrun, 2 ranks.

    Returns {key: tokens/s, the largest rank's peak RSS (MiB), the last loss}."""
    ranks = 2
    cores = len(os.sched_getaffinity(0))
    mode_args = ["--checkpointing", mode]
    if name == "deepspeed+cpu":
        mode_args.append("--cpu-checkpointing")
    argv = torchrun(args.python, ranks) + [
        os.path.join(HERE, "llama_peer.py"), name.split("+")[0], "--config", config, "--seq-len", str(context),
        *mode_args, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    p = run_capture(argv, args.timeout, env=peer_env(max(1, cores // ranks)))
    lines = json_lines(p.stdout)
    skipped = [x for x in lines if "skipped" in x]
    if skipped:  # the peer's own verdict, whatever torchrun's exit status
        raise Skipped(skipped[-1]["skipped"])
    out = p.stdout + p.stderr
    if p.returncode != 0:
        if killed_for_memory(out, p.returncode):
            raise Skipped(f"out of memory (exit {p.returncode}): {tail_of(out, 3)}")
        raise Failed(f"exit {p.returncode}: {' '.join(argv)}\n{tail_of(out)}", output=out)
    results = [x for x in lines if "tokens_per_s" in x]
    if not results:
        raise Failed(f"{name}: no result line in\n{out[-2000:]}")
    r = results[-1]
    info.setdefault("llama_peer_params", {})[name] = r["params"]
    info.setdefault("peer_precision", {})[name] = r["precision"]
    info.setdefault("peer_checkpointing", {})[f"{name} {mode}"] = r["checkpointing_impl"]
    info.setdefault("peer_start_rss_mib", {}).setdefault(name, []).append(r["start_rss_mib"])
    return {key: {"tokens_per_s": r["tokens_per_s"], "peak_rss_mib": r["peak_rss_mib"], "loss": r["loss_last"]}}


def llama_contestants(args, config, info):
    """zero3, FSDP2 and DeepSpeed at each context and checkpointing mode (2 ranks each), and zero3 and DeepSpeed
    with cpu_checkpointing at the full mode. Each figure: tokens/s and the largest rank's peak RSS (MiB)."""
    contestants = []

    def cpu_checkpointing_on(job):  # DeepSpeed's key, on a copy of the job
        job["activation_checkpointing"] = {"cpu_checkpointing": True}

    def zero3(context, mode, cpu_checkpointing=False):
        key = llama_key(context, mode)

        def run():
            edit = cpu_checkpointing_on if cpu_checkpointing else None
            return run_zero3_llama(args, config, key, context, mode, info, edit=edit)[0]

        return Contestant(f"zero3{'+cpu' if cpu_checkpointing else ''} {key}", run)

    def llama_peer(name, context, mode):
        key = llama_key(context, mode)
        return Contestant(f"{name} {key}", lambda: run_llama_peer(args, name, config, key, context, mode, info))

    comparisons = []
    for context in args.contexts:
        for mode in args.modes:
            key = llama_key(context, mode)
            contestants.append(zero3(context, mode))
            names = ["fsdp2", "deepspeed"] + (["deepspeed+cpu"] if mode == "full" else [])
            for name in names:
                contestants.append(llama_peer(name, context, mode))
                comparisons.append((f"llama ctx {context} {mode}", f"zero3 {key}", f"{name} {key}", key, "tok/s"))
            if mode == "full":
                contestants.append(zero3(context, mode, cpu_checkpointing=True))
                comparisons.append((f"llama ctx {context} full + cpu_checkpointing", f"zero3+cpu {key}",
                                    f"deepspeed+cpu {key}", key, "tok/s"))
    return contestants, comparisons


# ---- the nvme group -------------------------------------------------------------------------------------

NVME_DEVICES = ("nvme", "cpu")  # offload_optimizer.device of the group's runs; cpu is the reference

# DeepSpeed's aio defaults (deepspeed/runtime/swap_tensor/constants.py AIO_FORMAT), written out for both sides.
AIO_DEFAULTS = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                "overlap_events": True, "use_gds": False}

# Checks DeepSpeed's async_io op the way its optimizer swappers get it (deepspeed.ops.op_builder.AsyncIOBuilder,
# the CPU accelerator's builder under DS_ACCELERATOR=cpu), with the messages ds_report prints, and loads it (a JIT
# build when it is not cached): the build is then not inside the first round's DeepSpeed run.
AIO_PROBE = """
import json, os, sys, time
os.environ["DS_ACCELERATOR"] = "cpu"
from deepspeed.ops.op_builder import AsyncIOBuilder
builder = AsyncIOBuilder()
compatible = builder.is_compatible(verbose=True)
result = {"builder": type(builder).__module__, "compatible": bool(compatible)}
if compatible:
    t0 = time.perf_counter()
    try:
        builder.load()
        result["load_s"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 -- reported, not handled
        result["load_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
print(json.dumps(result), flush=True)
"""


def nvme_key(device, context):
    return f"offload-{device} {context}"


def error_line(text):
    """The first line of the exception a failed run reports (rank 0's when torchrun prefixes the ranks)."""
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\[rank\d+\]:\s?", "", line.strip())
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b:", line) and "ChildFailedError" not in line:
            found.append(line)
    return found[0] if found else None


def probe_async_io(args):
    """What DeepSpeed's async_io op says here: {"compatible", "warnings", "load_s" or "load_error"}."""
    p = run_capture([args.python, "-c", AIO_PROBE], args.timeout, env=peer_env(1))
    lines = json_lines(p.stdout)
    r = lines[-1] if lines else {"compatible": False, "load_error": error_line(p.stdout + p.stderr) or
                                 tail_of(p.stdout + p.stderr, 1)}
    r["warnings"] = [re.sub(r"\x1b\[[0-9;]*m", "", line).replace("[WARNING]", "").strip()
                     for line in p.stdout.splitlines() if "[WARNING]" in line and "async_io" in line]
    return r


def llama_param_count(model):
    """Elements of the Llama of zero3.model (tied or untied embeddings, no biases), by formula."""
    d, f, v, layers = model["hidden_size"], model["intermediate_size"], model["vocab_size"], model["layers"]
    heads = model["heads"]
    kv = model.get("kv_heads", heads) * (d // heads)
    block = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * f
    return v * d * (1 if model.get("tie_word_embeddings") else 2) + layers * block + d


def bytes_allocated(root):
    """Bytes the files under root occupy on the disk (st_blocks), files that vanish meanwhile skipped."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return total


class DiskWatch:
    """The largest bytes_allocated(root) seen while the block runs, sampled every `interval` seconds."""

    def __init__(self, root, interval=0.25):
        self.root, self.interval, self.peak = root, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while True:
            self.peak = max(self.peak, bytes_allocated(self.root))
            if self._stop.wait(self.interval):
                break

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, bytes_allocated(self.root))  # what a run left behind counts too
        return False


def nvme_contestants(args, config, info):
    """zero3 and DeepSpeed ZeRO-3 with offload_optimizer nvme (and, for reference, cpu) at each context, 2 ranks,
    no activation checkpointing. Each figure: tokens/s, the largest rank's peak RSS (MiB) and, for nvme, the most
    bytes the run's files under its nvme_path held at once (both ranks, MiB)."""
    contestants, comparisons = [], []

    def offload(device, nvme_path):
        def edit(job):
            block = {"device": device, "pin_memory": True}
            if device == "nvme":
                block.update({"nvme_path": nvme_path, "pipeline_read": True, "pipeline_write": True})
                job["aio"] = dict(AIO_DEFAULTS)
            job.setdefault("zero_optimization", {})["offload_optimizer"] = block
            job["zero_optimization"].pop("offload_param", None)

        return edit

    def contestant(who, device, context):
        key = nvme_key(device, context)

        def run():
            with tempfile.TemporaryDirectory(prefix="zero3-peers-nvme-job-") as tmp:
                # A fresh nvme_path per run (DeepSpeed leaves its swap files behind), removed after it.
                nvme_path = os.path.join(args.nvme_root, f"{who}-{device}-{context}")
                os.makedirs(nvme_path, exist_ok=True)
                try:
                    edit = offload(device, nvme_path)
                    with DiskWatch(nvme_path) as disk:
                        if who == "zero3":
                            figures, out = run_zero3_llama(args, config, key, context, "none", info, edit=edit)
                            m = re.search(r"NVMe offload: .*?(\d+) bytes of files per rank", out)
                            if m:
                                info["zero3_nvme_files"] = int(m.group(1))
                        else:
                            with open(config) as f:
                                job = json.load(f)
                            edit(job)
                            path = os.path.join(tmp, "job.json")
                            with open(path, "w") as f:
                                json.dump(job, f)
                            try:
                                figures = run_llama_peer(args, who, path, key, context, "none", info)
                            except Failed as e:
                                line = error_line(e.output)
                                if device != "nvme" or not line:
                                    raise
                                info.setdefault("row_notes", {})[f"{who} {key}"] = f"fails on CPU: {line}"
                                if "async_io" in line:  # the op cannot load here: the same in every round
                                    raise Skipped(f"fails on CPU: {line}") from e
                                raise
                finally:
                    shutil.rmtree(nvme_path, ignore_errors=True)
                if device == "nvme":
                    figures[key]["disk_mib"] = disk.peak / 2**20
                return figures

        return Contestant(f"{who} {key}", run)

    for context in args.contexts:
        for device in NVME_DEVICES:
            key = nvme_key(device, context)
            contestants += [contestant("zero3", device, context), contestant("deepspeed", device, context)]
            comparisons.append((f"offload_optimizer {device} ctx {context}", f"zero3 {key}", f"deepspeed {key}", key,
                                "tok/s"))
    return contestants, comparisons


def print_nvme_costs(args, results, rounds):
    """Per contestant and context: median tok/s with CPU offload over median tok/s with NVMe offload (what the
    disk costs), the median peak RSS of each, and the median peak bytes on disk."""
    print("NVMe cost: median tok/s with offload_optimizer cpu / with nvme; peak RSS MiB of the largest rank and "
          "peak MiB of files under nvme_path (both ranks), median")
    head = (f"{'contestant':<10} {'context':>7} {'cpu tok/s':>10} {'nvme tok/s':>10} {'cpu/nvme':>9} "
            f"{'cpu MiB':>9} {'nvme MiB':>9} {'disk MiB':>9}")
    print(head)
    print("-" * len(head))
    for context in args.contexts:
        for who in ("zero3", "deepspeed"):
            cpu_key, nvme_key_ = nvme_key("cpu", context), nvme_key("nvme", context)
            cpu = median_figure(results, f"{who} {cpu_key}", rounds, cpu_key, "tokens_per_s")
            nvme = median_figure(results, f"{who} {nvme_key_}", rounds, nvme_key_, "tokens_per_s")
            cost = f"{cpu / nvme:.2f}x" if cpu and nvme else "-"
            cpu_rss = median_figure(results, f"{who} {cpu_key}", rounds, cpu_key, "peak_rss_mib")
            nvme_rss = median_figure(results, f"{who} {nvme_key_}", rounds, nvme_key_, "peak_rss_mib")
            disk = median_figure(results, f"{who} {nvme_key_}", rounds, nvme_key_, "disk_mib")
            print(f"{who:<10} {context:>7} {fmt_value(cpu):>10} {fmt_value(nvme):>10} {cost:>9} "
                  f"{fmt_value(cpu_rss):>9} {fmt_value(nvme_rss):>9} {fmt_value(disk):>9}")


def describe_async_io(aio):
    if not aio.get("compatible"):
        why = "; ".join(aio.get("warnings") or []) or aio.get("load_error") or "no reason given"
        return f"not compatible here ({why})"
    if "load_error" in aio:
        return f"compatible, but loading it failed: {aio['load_error']}"
    return f"compatible, loaded in {aio['load_s']:.1f} s (a JIT build into ~/.cache/torch_extensions when not cached)"


def check_nvme_path(path):
    """Why `path` cannot hold the NVMe runs' files (not a writable directory, no O_DIRECT), or None."""
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not a writable directory"
    probe = os.path.join(path, f".zero3-peers-odirect-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
        try:
            block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
            os.write(fd, block)
        finally:
            os.close(fd)
    except OSError as e:
        return f"{path} does not take O_DIRECT writes ({e.strerror}); both NVMe offloads open their files with it"
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
    return None


def median_figure(results, contestant, rounds, key, metric):
    got = [figure(results, contestant, r, key, metric) for r in range(rounds)]
    got = [x for x in got if x is not None]
    return statistics.median(got) if got else None


def print_checkpointing_costs(args, results, rounds):
    """Per contestant and context: median tok/s without checkpointing over median tok/s with each mode (the
    slowdown the mode costs), and the median peak RSS of each mode."""
    modes = [m for m in args.modes if m != "none"]
    print(f"checkpointing cost: median tok/s with none / median tok/s with the mode (goals: full <= 1.40x, "
          f"selective <= 1.15x); peak RSS MiB of the largest rank, median")
    head = f"{'contestant':<14} {'context':>7} {'none tok/s':>10}"
    head += "".join(f" {m + ' x':>12}" for m in modes)
    head += "".join(f" {m + ' MiB':>14}" for m in args.modes)
    print(head)
    print("-" * len(head))
    for context in args.contexts:
        for name in ("zero3", "zero3+cpu") + LLAMA_PEERS:
            # zero3+cpu and deepspeed+cpu are variants of the full mode: their none is zero3's and DeepSpeed's
            base_name = name.split("+")[0]
            base = median_figure(results, f"{base_name} {llama_key(context, 'none')}", rounds,
                                 llama_key(context, "none"), "tokens_per_s") if "none" in args.modes else None
            row = f"{name:<14} {context:>7} {fmt_value(base):>10}"
            own = 0  # figures of this contestant itself (a +cpu row is left out without any)
            for m in modes:
                rate = median_figure(results, f"{name} {llama_key(context, m)}", rounds, llama_key(context, m),
                                     "tokens_per_s")
                own += rate is not None
                row += f" {(f'{base / rate:.2f}x' if base and rate else '-'):>12}"
            for m in args.modes:
                who = base_name if (name.endswith("+cpu") and m == "none") else name
                rss = median_figure(results, f"{who} {llama_key(context, m)}", rounds, llama_key(context, m),
                                    "peak_rss_mib")
                own += rss is not None and who == name
                row += f" {fmt_value(rss):>14}"
            if own or not name.endswith("+cpu"):
                print(row)


# ---- the table ------------------------------------------------------------------------------------------


def figure(results, contestant, rnd, key, metric=None):
    """The contestant's figure in a round: by default tokens/s for a GPT or Llama key, Gparam/s for an
    optimizer size; metric names another (peak_rss_mib)."""
    r = results.get((contestant, rnd))
    if not r or key not in r:
        return None
    v = r[key]
    if metric:
        return v.get(metric)
    return v.get("tokens_per_s", v.get("gparams_per_s"))


def fmt_value(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def print_table(comparisons, results, rounds, metric=None, unit_override=None, notes=None):
    """notes: {peer contestant: text}, printed at the end of a row in which that peer has no figure."""
    rows = []
    for title, z, p, key, unit in comparisons:
        unit = unit_override or unit
        ratios, zs, ps = [], [], []
        for r in range(rounds):
            zv, pv = figure(results, z, r, key, metric), figure(results, p, r, key, metric)
            if zv is not None:
                zs.append(zv)
            if pv is not None:
                ps.append(pv)
            ratios.append(zv / pv if zv is not None and pv else None)
        got = [x for x in ratios if x is not None]
        note = (notes or {}).get(p) if not ps else None
        rows.append((title, z.split(" ")[0], p.split(" ")[0], unit + (f"  {note}" if note else ""), ratios, got, zs,
                     ps))
    width = max(len(r[0]) for r in rows) if rows else 10
    head = (f"{'comparison':<{width}}  {'peer':<13} {'per round zero3/peer':<{max(20, 6 * rounds)}} {'median':>7} "
            f"{'range':>13}  {'zero3':>9} {'peer':>9}  unit")
    print(head)
    print("-" * len(head))
    for title, _, peer, unit, ratios, got, zs, ps in rows:
        per = " ".join("  -  " if x is None else f"{x:5.2f}" for x in ratios)
        med = f"{statistics.median(got):7.2f}" if got else f"{'-':>7}"
        rng = f"{min(got):5.2f}-{max(got):5.2f}" if got else "-"
        zm = fmt_value(statistics.median(zs)) if zs else "-"
        pm = fmt_value(statistics.median(ps)) if ps else "-"
        print(f"{title:<{width}}  {peer:<13} {per:<{max(20, 6 * rounds)}} {med} {rng:>13}  {zm:>9} {pm:>9}  {unit}")


# ---- main -----------------------------------------------------------------------------------------------


def check_python(python):
    probe = ("import os; os.environ['DS_ACCELERATOR'] = 'cpu'; import torch, deepspeed; "
             "print(torch.__version__, deepspeed.__version__)")
    try:
        p = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or ["(no message)"])[-1]
    return p.stdout.strip().splitlines()[-1], None


def default_python():
    venv = os.environ.get("ZERO3_PEERS_VENV", DEFAULT_VENV)
    candidate = os.path.join(venv, "bin", "python")
    return candidate if os.path.exists(candidate) else sys.executable


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zero3", default="build-host/bin/zero3", help="the zero3 program (the GPT and Llama runs)")
    ap.add_argument("--zero3-bench", default=None,
                    help="the zero3-bench program (the optimizer runs); default: zero3-bench beside --zero3")
    ap.add_argument("--python", default=None,
                    help="the peers' Python (torch, deepspeed); default $ZERO3_PEERS_VENV/bin/python, "
                         "~/.cache/zero3-peers-venv/bin/python when it exists, else this Python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["gpt", "optimizer", "llama", "nvme"],
                    help="run one group of comparisons (default: gpt and optimizer; llama and nvme run only when "
                         "named)")
    ap.add_argument("--config", default="configs/gpt-small.json", help="the GPT job (its zero3.model block)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"timed optimizer steps of each GPT run ({GPT_STEPS}) or Llama run ({LLAMA_STEPS})")
    ap.add_argument("--warmup", type=int, default=None,
                    help=f"untimed steps before them (GPT {GPT_WARMUP}, Llama {LLAMA_WARMUP})")
    ap.add_argument("--fp32", action="store_true", help="also run the GPT comparisons in fp32")
    ap.add_argument("--params", default="10M,100M,1B", help="optimizer sizes (skipped when they do not fit)")
    ap.add_argument("--threads", type=int, default=2, help="optimizer threads")
    ap.add_argument("--repeats", type=int, default=5, help="optimizer steps per size and run; the best counts")
    ap.add_argument("--llama-config", default="configs/smollm-135m.json",
                    help="the Llama job of --only llama and --only nvme (its zero3.model block, batch, optimizer, "
                         "offload)")
    ap.add_argument("--contexts", default=None,
                    help=f"the Llama contexts (--model.seq_len), comma-separated (--only llama: {LLAMA_CONTEXTS}, "
                         f"--only nvme: {NVME_CONTEXTS})")
    ap.add_argument("--nvme-path", default=DEFAULT_NVME_PATH,
                    help="--only nvme: the directory under which each run gets its offload_optimizer.nvme_path "
                         "(a disk that takes O_DIRECT; removed after each run)")
    ap.add_argument("--modes", default="none,full,selective",
                    help="the Llama activation-checkpointing modes, comma-separated (none, full, selective)")
    # --bind-to none: Open MPI binds each of up to two ranks to one core by default, which leaves a single
    # rank one core of two; the peers' torchrun does not bind.
    ap.add_argument("--mpirun", default="mpirun --oversubscribe --allow-run-as-root --bind-to none",
                    help="how zero3's ranks are launched (the -np N is added)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds one contestant's run may take")
    ap.add_argument("--contestants", default=None,
                    help="run only these, by name (comma-separated: zero3,zero3+cpu,fsdp2,deepspeed,deepspeed+cpu)")
    ap.add_argument("--seed", type=int, default=1, help="seeds each round's order of the contestants")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="idle seconds after each optimizer run: the next run is slower while its GBs are reclaimed")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    groups = {"gpt", "optimizer"} if args.only is None else {args.only}
    if args.steps is None:
        args.steps = LLAMA_STEPS if groups & {"llama", "nvme"} else GPT_STEPS
    if args.warmup is None:
        args.warmup = LLAMA_WARMUP if groups & {"llama", "nvme"} else GPT_WARMUP
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--rounds and --steps must be at least 1, --warmup at least 0")
    args.mpirun = args.mpirun.split()
    args.params = [s.strip() for s in args.params.split(",") if s.strip()]
    if args.contexts is None:
        args.contexts = NVME_CONTEXTS if "nvme" in groups else LLAMA_CONTEXTS
    try:
        args.contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--contexts: not a list of integers: {args.contexts}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if groups & {"llama", "nvme"}:
        if not args.contexts or min(args.contexts) < 1:
            ap.error("--contexts needs at least one positive context")
        if not args.modes or not set(args.modes) <= {"none", "full", "selective"}:
            ap.error(f"--modes: each of none, full, selective, not {','.join(args.modes)}")
    args.python = args.python or default_python()
    args.zero3 = os.path.abspath(args.zero3)
    args.zero3_bench = os.path.abspath(args.zero3_bench or os.path.join(os.path.dirname(args.zero3), "zero3-bench"))
    config_path = os.path.abspath(args.config)

    if not os.access(args.zero3, os.X_OK):
        print(f"run.py: {args.zero3} is not an executable zero3 program (build it, or pass --zero3)", file=sys.stderr)
        return 2
    if "optimizer" in groups and not os.access(args.zero3_bench, os.X_OK):
        print(f"run.py: {args.zero3_bench} is not an executable zero3-bench program (build the zero3-bench target, "
              f"or pass --zero3-bench)", file=sys.stderr)
        return 2
    versions, why = check_python(args.python)
    if versions is None:
        print(f"run.py: {args.python} cannot import torch and deepspeed ({why}).\n"
              f"Install the peers with tools/python/peers/setup.sh [VENV] and pass --python VENV/bin/python "
              f"(or set ZERO3_PEERS_VENV).", file=sys.stderr)
        return 2
    if groups & {"gpt", "llama", "nvme"} and not shutil.which(args.mpirun[0]):
        print(f"run.py: {args.mpirun[0]} not found: zero3's ranks need it (--mpirun)", file=sys.stderr)
        return 2

    info = {}
    m = None
    if "gpt" in groups:
        cfg = peers_config.load_config(config_path)
        m = peers_config.model_settings(cfg)
        info["bf16"] = peers_config.bf16_enabled(cfg)
    if groups & {"llama", "nvme"}:
        if not os.path.exists(args.llama_config):
            print(f"run.py: {args.llama_config}: no such config (--llama-config)", file=sys.stderr)
            return 2
        llama_cfg = peers_config.load_config(os.path.abspath(args.llama_config))
        llama_model = llama_cfg.get("zero3", {}).get("model", {})
        if llama_model.get("type") != "llama":
            print(f"run.py: {args.llama_config}: zero3.model.type is {llama_model.get('type')!r}, not llama",
                  file=sys.stderr)
            return 2
    args.nvme_root = None
    if "nvme" in groups:
        why = check_nvme_path(args.nvme_path)
        if why:
            print(f"run.py: --nvme-path: {why}", file=sys.stderr)
            return 2
        # fp32 master, two moments and the fp32 gradient of every param, over both ranks; one run at a time.
        needed = 16 * llama_param_count(llama_model)
        free = shutil.disk_usage(args.nvme_path).free
        if free < needed * 5 // 4:
            print(f"run.py: --nvme-path {args.nvme_path}: {free / 2**30:.1f} GiB free, an NVMe run of this model "
                  f"needs about {needed / 2**30:.1f} GiB (16 bytes per param)", file=sys.stderr)
            return 2
        args.nvme_root = tempfile.mkdtemp(prefix="zero3-peers-nvme-", dir=args.nvme_path)
    tmp = tempfile.mkdtemp(prefix="zero3-peers-")
    try:
        contestants, comparisons = [], []
        if "optimizer" in groups:
            c, k = optimizer_contestants(args, info)
            contestants += c
            comparisons += k
        if "gpt" in groups:
            base = peers_config.quiet(cfg)
            if not peers_config.offloads(base)[0]:
                print("note: the config offloads no optimizer; the offload comparison runs it as given",
                      file=sys.stderr)
            derived = {"offload": base, "ondevice": peers_config.without_offload(base)}
            derived["offload_fp32"] = peers_config.in_fp32(derived["offload"])
            derived["ondevice_fp32"] = peers_config.in_fp32(derived["ondevice"])
            configs = {}
            for name, c in derived.items():
                configs[name] = os.path.join(tmp, f"{name}.json")
                with open(configs[name], "w") as f:
                    json.dump(c, f, indent=1)
            c, k = gpt_contestants(args, configs, info)
            contestants += c
            comparisons += k
        if "llama" in groups:
            llama_path = os.path.join(tmp, "llama.json")
            with open(llama_path, "w") as f:
                json.dump(peers_config.quiet(llama_cfg), f, indent=1)
            c, k = llama_contestants(args, llama_path, info)
            contestants += c
            comparisons += k
        if "nvme" in groups:
            nvme_path = os.path.join(tmp, "llama-nvme.json")
            with open(nvme_path, "w") as f:
                json.dump(peers_config.quiet(llama_cfg), f, indent=1)
            c, k = nvme_contestants(args, nvme_path, info)
            contestants += c
            comparisons += k

        print(f"peers: torch {versions.split()[0]}, deepspeed {versions.split()[1]} ({args.python})")
        print(f"zero3: {args.zero3}" + (f", {args.zero3_bench}" if "optimizer" in groups else ""))
        if "gpt" in groups:
            print(f"model: {peers_config.describe(m)}; {args.warmup} + {args.steps} steps per GPT run")
        if "llama" in groups:
            print(f"llama: {describe_llama(llama_model)} ({args.llama_config}); contexts "
                  f"{','.join(map(str, args.contexts))}; checkpointing {','.join(args.modes)}; "
                  f"{args.warmup} + {args.steps} steps per run, 2 ranks")
        if "nvme" in groups:
            print(f"nvme: {describe_llama(llama_model)} ({args.llama_config}); contexts "
                  f"{','.join(map(str, args.contexts))}; no activation checkpointing; offload_optimizer nvme "
                  f"(pipeline_read, pipeline_write, DeepSpeed's aio defaults) and cpu; nvme_path under "
                  f"{args.nvme_root}; {args.warmup} + {args.steps} steps per run, 2 ranks")
            if not args.contestants or "deepspeed" in args.contestants.split(","):
                aio = probe_async_io(args)
                info["async_io"] = aio
                print(f"DeepSpeed async_io op: {describe_async_io(aio)}", flush=True)
        if args.contestants:  # by name before the key: "zero3", "zero3+cpu", "fsdp2", "deepspeed", ...
            wanted = set(args.contestants.split(","))
            contestants = [c for c in contestants if c.name.split(" ")[0] in wanted]
            comparisons = [k for k in comparisons if k[1].split(" ")[0] in wanted and k[2].split(" ")[0] in wanted]
        print(f"{len(contestants)} contestants x {args.rounds} rounds, order shuffled per round (seed {args.seed}), "
              f"{args.settle:g} s idle after each optimizer run", flush=True)
        results = {}
        failures = []
        skipped = {}  # contestant -> why; not run again in later rounds (an out-of-memory run costs the most)
        width = max([24] + [len(c.name) for c in contestants])
        for rnd in range(args.rounds):
            order = random.Random(args.seed * 1000 + rnd).sample(contestants, len(contestants))
            previous = None
            for c in order:
                if c.name in skipped:
                    print(f"round {rnd + 1}/{args.rounds}  {c.name:<{width}}     0.0 s  skipped (as before)",
                          flush=True)
                    continue
                if previous is not None and previous.heavy:
                    time.sleep(args.settle)
                previous = c
                t0 = time.perf_counter()
                try:
                    results[(c.name, rnd)] = c.run()
                    status = "ok"
                except Skipped as e:
                    skipped[c.name] = str(e)
                    info.setdefault("skipped", {})[c.name] = str(e)
                    status = "skipped: " + str(e).splitlines()[0]
                except Failed as e:
                    failures.append((c.name, rnd, str(e)))
                    status = "FAILED: " + str(e).splitlines()[0]
                print(f"round {rnd + 1}/{args.rounds}  {c.name:<{width}} {time.perf_counter() - t0:7.1f} s  {status}",
                      flush=True)

        print()
        if "zero3_params" in info:
            formula = f"; zero3's formula {peers_config.gpt_param_count(m):,}" if m else ""
            print(f"params: zero3 train reports {info['zero3_params']:,} ({info['zero3_model']}){formula}")
        for name, (counted, formula) in sorted(info.get("peer_params", {}).items()):
            mark = "" if counted == formula else "  MISMATCH"
            print(f"params: {name}: {counted:,} (formula {formula:,}){mark}")
        for name, counted in sorted(info.get("llama_peer_params", {}).items()):
            mark = "" if counted == info.get("zero3_params", counted) else "  (differs from zero3's)"
            print(f"params: {name}: {counted:,}{mark}")
        for name, what in sorted(info.get("peer_precision", {}).items()):
            print(f"precision: {name}: {what}")
        for name, what in sorted(info.get("peer_checkpointing", {}).items()):
            print(f"checkpointing: {name}: {what}")
        for name, values in sorted(info.get("peer_start_rss_mib", {}).items()):
            print(f"peak RSS before the model: {name}: {statistics.median(values):.0f} MiB (the interpreter and "
                  f"its libraries, in every {name} figure below)")
        if "cpu_adam_load_s" in info:
            loads = info["cpu_adam_load_s"]
            print(f"DeepSpeedCPUAdam op: first load {loads[0]:.1f} s (a JIT build when not cached), later "
                  f"{min(loads):.1f} s")
        for name, why in sorted(info.get("skipped", {}).items()):
            print(f"skipped: {name}: {why}")
        if "async_io" in info:
            print(f"DeepSpeed async_io op: {describe_async_io(info['async_io'])}")
        if "zero3_nvme_files" in info:
            print(f"zero3 NVMe files: {info['zero3_nvme_files']:,} bytes per rank (zero3 train's log)")
        print()
        llama_comparisons = [k for k in comparisons if k[3].startswith("llama ")]
        nvme_comparisons = [k for k in comparisons if k[3].startswith("offload-")]
        other_comparisons = [k for k in comparisons if k not in llama_comparisons and k not in nvme_comparisons]
        if other_comparisons:
            print_table(other_comparisons, results, args.rounds)
            print("\nratio = zero3's figure / the peer's in the same round (> 1: zero3 faster); median and range "
                  "over the rounds;\nzero3 and peer = median absolute figures (tok/s: tokens per second of the "
                  "whole job; Gpar/s: 1e9 params per second, x 28 = GB/s)")
        if llama_comparisons:
            print("tokens per second of the whole job (2 ranks)")
            print_table(llama_comparisons, results, args.rounds)
            print("\npeak resident set size of the largest rank, MiB")
            print_table(llama_comparisons, results, args.rounds, metric="peak_rss_mib", unit_override="MiB")
            print("\nratio = zero3's figure / the peer's in the same round (tok/s: > 1, zero3 faster; MiB: < 1, zero3 "
                  "smaller); median and range over the rounds;\nzero3 and peer = median absolute figures; "
                  "deepspeed+cpu = DeepSpeed full with activation_checkpointing.cpu_checkpointing\n")
            print_checkpointing_costs(args, results, args.rounds)
        if nvme_comparisons:
            notes = info.get("row_notes", {})
            print("tokens per second of the whole job (2 ranks)")
            print_table(nvme_comparisons, results, args.rounds, notes=notes)
            print("\npeak resident set size of the largest rank, MiB")
            print_table(nvme_comparisons, results, args.rounds, metric="peak_rss_mib", unit_override="MiB",
                        notes=notes)
            print("\npeak bytes of the run's files under its nvme_path (both ranks), MiB")
            print_table([k for k in nvme_comparisons if k[3].startswith("offload-nvme ")], results, args.rounds,
                        metric="disk_mib", unit_override="MiB", notes=notes)
            print("\nratio = zero3's figure / the peer's in the same round (tok/s: > 1, zero3 faster; MiB: < 1, zero3 "
                  "smaller); median and range over the rounds;\nzero3 and peer = median absolute figures\n")
            print_nvme_costs(args, results, args.rounds)
        if failures:
            print(f"\n{len(failures)} runs failed:")
            for name, rnd, why in failures:
                print(f"--- {name}, round {rnd + 1}:\n{why}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": [{"contestant": k[0], "round": k[1], "figures": v} for k, v in results.items()],
                           "failures": [{"contestant": n, "round": r, "error": e} for n, r, e in failures],
                           "info": info}, f, indent=1)
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if args.nvme_root:
            shutil.rmtree(args.nvme_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
