#!/usr/bin/env python3
"""zero3 side by side with its peers on the CPU: interleaved rounds, the ratio zero3/peer per round.

  python tools/python/peers/run.py --zero3 build-host/bin/zero3 --rounds 5 [--only gpt|optimizer]
                                  [--config configs/gpt-small.json] [--python VENV/bin/python]
                                  [--zero3-bench build-host/bin/zero3-bench]

The GPT runs are `zero3 train` jobs, the optimizer runs `zero3-bench cpu-optimizer` (by default the
zero3-bench beside --zero3: both are built into the build tree's bin/).

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
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
DEFAULT_VENV = os.path.join(os.environ.get("HOME", "~"), ".cache", "zero3-peers-venv")
SIZES = {"10M": 10**7, "100M": 10**8, "1B": 10**9}


class Failed(Exception):
    pass


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
                with open(metrics) as f:
                    lines = json_lines(f.read())
                timed = [x for x in lines if x["step"] > warmup]
                if not timed:
                    raise Failed(f"zero3 train wrote no timed window to {metrics}")
                # Windows of equal length: the run's rate is the harmonic mean of theirs.
                rate = len(timed) / sum(1.0 / x["tokens_per_s"] for x in timed)
                return {key: {"tokens_per_s": rate, "loss": timed[-1]["loss"]}}

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


# ---- the table ------------------------------------------------------------------------------------------


def figure(results, contestant, rnd, key):
    """The contestant's figure in a round: tokens/s for a GPT key, Gparam/s for an optimizer size."""
    r = results.get((contestant, rnd))
    if not r or key not in r:
        return None
    v = r[key]
    return v.get("tokens_per_s", v.get("gparams_per_s"))


def fmt_value(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def print_table(comparisons, results, rounds):
    rows = []
    for title, z, p, key, unit in comparisons:
        ratios, zs, ps = [], [], []
        for r in range(rounds):
            zv, pv = figure(results, z, r, key), figure(results, p, r, key)
            if zv is not None:
                zs.append(zv)
            if pv is not None:
                ps.append(pv)
            ratios.append(zv / pv if zv is not None and pv else None)
        got = [x for x in ratios if x is not None]
        rows.append((title, z.split(" ")[0], p.split(" ")[0], unit, ratios, got, zs, ps))
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
    ap.add_argument("--zero3", default="build-host/bin/zero3", help="the zero3 program (the GPT runs)")
    ap.add_argument("--zero3-bench", default=None,
                    help="the zero3-bench program (the optimizer runs); default: zero3-bench beside --zero3")
    ap.add_argument("--python", default=None,
                    help="the peers' Python (torch, deepspeed); default $ZERO3_PEERS_VENV/bin/python, "
                         "~/.cache/zero3-peers-venv/bin/python when it exists, else this Python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["gpt", "optimizer"], help="run one group of comparisons")
    ap.add_argument("--config", default="configs/gpt-small.json", help="the GPT job (its zero3.model block)")
    ap.add_argument("--steps", type=int, default=12, help="timed optimizer steps of each GPT run")
    ap.add_argument("--warmup", type=int, default=4, help="untimed steps before them")
    ap.add_argument("--fp32", action="store_true", help="also run the GPT comparisons in fp32")
    ap.add_argument("--params", default="10M,100M,1B", help="optimizer sizes (skipped when they do not fit)")
    ap.add_argument("--threads", type=int, default=2, help="optimizer threads")
    ap.add_argument("--repeats", type=int, default=5, help="optimizer steps per size and run; the best counts")
    # --bind-to none: Open MPI binds each of up to two ranks to one core by default, which leaves a single
    # rank one core of two; the peers' torchrun does not bind.
    ap.add_argument("--mpirun", default="mpirun --oversubscribe --allow-run-as-root --bind-to none",
                    help="how zero3's ranks are launched (the -np N is added)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds one contestant's run may take")
    ap.add_argument("--seed", type=int, default=1, help="seeds each round's order of the contestants")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="idle seconds after each optimizer run: the next run is slower while its GBs are reclaimed")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--rounds and --steps must be at least 1, --warmup at least 0")
    args.mpirun = args.mpirun.split()
    args.params = [s.strip() for s in args.params.split(",") if s.strip()]
    args.python = args.python or default_python()
    args.zero3 = os.path.abspath(args.zero3)
    args.zero3_bench = os.path.abspath(args.zero3_bench or os.path.join(os.path.dirname(args.zero3), "zero3-bench"))
    config_path = os.path.abspath(args.config)

    if not os.access(args.zero3, os.X_OK):
        print(f"run.py: {args.zero3} is not an executable zero3 program (build it, or pass --zero3)", file=sys.stderr)
        return 2
    if args.only != "gpt" and not os.access(args.zero3_bench, os.X_OK):
        print(f"run.py: {args.zero3_bench} is not an executable zero3-bench program (build the zero3-bench target, "
              f"or pass --zero3-bench)", file=sys.stderr)
        return 2
    versions, why = check_python(args.python)
    if versions is None:
        print(f"run.py: {args.python} cannot import torch and deepspeed ({why}).\n"
              f"Install the peers with tools/python/peers/setup.sh [VENV] and pass --python VENV/bin/python "
              f"(or set ZERO3_PEERS_VENV).", file=sys.stderr)
        return 2
    if args.only != "optimizer" and not shutil.which(args.mpirun[0]):
        print(f"run.py: {args.mpirun[0]} not found: zero3's ranks need it (--mpirun)", file=sys.stderr)
        return 2

    cfg = peers_config.load_config(config_path)
    m = peers_config.model_settings(cfg)
    info = {"bf16": peers_config.bf16_enabled(cfg)}
    tmp = tempfile.mkdtemp(prefix="zero3-peers-")
    try:
        base = peers_config.quiet(cfg)
        if not peers_config.offloads(base)[0]:
            print("note: the config offloads no optimizer; the offload comparison runs it as given", file=sys.stderr)
        derived = {"offload": base, "ondevice": peers_config.without_offload(base)}
        derived["offload_fp32"] = peers_config.in_fp32(derived["offload"])
        derived["ondevice_fp32"] = peers_config.in_fp32(derived["ondevice"])
        configs = {}
        for name, c in derived.items():
            configs[name] = os.path.join(tmp, f"{name}.json")
            with open(configs[name], "w") as f:
                json.dump(c, f, indent=1)

        contestants, comparisons = [], []
        if args.only != "gpt":
            c, k = optimizer_contestants(args, info)
            contestants += c
            comparisons += k
        if args.only != "optimizer":
            c, k = gpt_contestants(args, configs, info)
            contestants += c
            comparisons += k

        print(f"peers: torch {versions.split()[0]}, deepspeed {versions.split()[1]} ({args.python})")
        print(f"zero3: {args.zero3}" + (f", {args.zero3_bench}" if args.only != "gpt" else ""))
        print(f"model: {peers_config.describe(m)}; {args.warmup} + {args.steps} steps per GPT run")
        print(f"{len(contestants)} contestants x {args.rounds} rounds, order shuffled per round (seed {args.seed}), "
              f"{args.settle:g} s idle after each optimizer run", flush=True)
        results = {}
        failures = []
        for rnd in range(args.rounds):
            order = random.Random(args.seed * 1000 + rnd).sample(contestants, len(contestants))
            previous = None
            for c in order:
                if previous is not None and previous.heavy:
                    time.sleep(args.settle)
                previous = c
                t0 = time.perf_counter()
                try:
                    results[(c.name, rnd)] = c.run()
                    status = "ok"
                except Failed as e:
                    failures.append((c.name, rnd, str(e)))
                    status = "FAILED: " + str(e).splitlines()[0]
                print(f"round {rnd + 1}/{args.rounds}  {c.name:<24} {time.perf_counter() - t0:7.1f} s  {status}",
                      flush=True)

        print()
        if "zero3_params" in info:
            print(f"params: zero3 train reports {info['zero3_params']:,} ({info['zero3_model']}); "
                  f"zero3's formula {peers_config.gpt_param_count(m):,}")
        for name, (counted, formula) in sorted(info.get("peer_params", {}).items()):
            mark = "" if counted == formula else "  MISMATCH"
            print(f"params: {name}: {counted:,} (formula {formula:,}){mark}")
        for name, what in sorted(info.get("peer_precision", {}).items()):
            print(f"precision: {name}: {what}")
        if "cpu_adam_load_s" in info:
            loads = info["cpu_adam_load_s"]
            print(f"DeepSpeedCPUAdam op: first load {loads[0]:.1f} s (a JIT build when not cached), later "
                  f"{min(loads):.1f} s")
        for name, why in sorted(info.get("skipped", {}).items()):
            print(f"skipped: {name}: {why}")
        print()
        print_table(comparisons, results, args.rounds)
        print("\nratio = zero3's figure / the peer's in the same round (> 1: zero3 faster); median and range over "
              "the rounds;\nzero3 and peer = median absolute figures (tok/s: tokens per second of the whole job; "
              "Gpar/s: 1e9 params per second, x 28 = GB/s)")
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


if __name__ == "__main__":
    sys.exit(main())
