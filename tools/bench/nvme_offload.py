#!/usr/bin/env python3
"""NVMe offload of the optimizer at a size whose fp32 state does not fit in host memory, with the disk's own
O_DIRECT bandwidth measured in the same run.

1. fio on --nvme-path as the job uses the disk (one job per rank, a file each; io_uring, O_DIRECT, the config's
   aio block_size and queue_depth): sequential write, sequential read, and a mix in the proportion of the
   update's reads and writes.
2. `mpirun -np N zero3 train --config CONFIG` (wall_clock_breakdown on, --metrics to a file): the update's
   disk figures per step (the "disk" object of each metrics line: bytes read and written by the update, the
   time of its disk pass and the time the engine thread waited for the disk), and each rank's peak RSS
   (getrusage of a wrapper around each rank).
3. A table: per step, the update's bytes, its time and bandwidth next to what fio measured, and the
   efficiency: the time the disk needs for those bytes at fio's separate read and write bandwidths (ranks
   share the disk: all ranks' bytes count), over the update's time.

With --params-on-nvme the params go to the same disk too (offload_param nvme, max_in_cpu 0: every sharded unit
read at each gather); the table then also shows what the gathers read and how long they waited.

Usage: python3 tools/bench/nvme_offload.py [--zero3 build-host/bin/zero3] [--config configs/llama-2.5b-nvme.json]
       [--nvme-path /var/tmp/zero3-nvme] [--np 2] [--steps 3] [--fio-seconds 20] [--params-on-nvme] [--json OUT]
The first step is a warm-up (its update is the first pass over freshly written files); the table shows every
step and the summary the later ones. Needs fio and mpirun; the job needs the plan's disk bytes free.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

RANK_RSS_WRAPPER = """
import json, os, resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
with open(os.path.join(sys.argv[1], f"rss-rank{rank}.json"), "w") as f:
    json.dump({"rank": int(rank), "returncode": rc,
               "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, f)
sys.exit(rc)
"""


def fio(directory, jobs, rw, block, depth, seconds, size, mix_read=None):
    """`jobs` fio jobs at once, a file each in `directory`; returns their summed (read MB/s, write MB/s)."""
    argv = ["fio", "--name=disk", f"--directory={directory}", "--filename_format=fio-probe.$jobnum", f"--rw={rw}",
            f"--bs={block}", f"--iodepth={depth}", "--ioengine=io_uring", "--direct=1", f"--size={size}",
            "--time_based", f"--runtime={seconds}", f"--numjobs={jobs}", "--group_reporting",
            "--output-format=json"]
    if mix_read is not None:
        argv.append(f"--rwmixread={mix_read}")
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return job["read"]["bw_bytes"] / 1e6, job["write"]["bw_bytes"] / 1e6


def measure_disk(directory, jobs, config, seconds, size, mix_read):
    """The disk as the job uses it: one stream of requests per rank, the config's block size and depth."""
    aio = config.get("aio", {})
    block = int(aio.get("block_size", 1048576))
    depth = int(aio.get("queue_depth", 8))
    try:
        _, write = fio(directory, jobs, "write", block, depth, seconds, size)
        read, _ = fio(directory, jobs, "read", block, depth, seconds, size)
        mixed_r, mixed_w = fio(directory, jobs, "rw", block, depth, seconds, size, mix_read)
    finally:
        for name in os.listdir(directory):
            if name.startswith("fio-probe."):
                os.remove(os.path.join(directory, name))
    return {"jobs": jobs, "block_bytes": block, "queue_depth": depth, "read_mb_s": read, "write_mb_s": write,
            "mixed_read_mb_s": mixed_r, "mixed_write_mb_s": mixed_w, "mixed_read_percent": mix_read}


def run_job(args, config_path, tmp):
    metrics = os.path.join(tmp, "metrics.jsonl")
    argv = args.mpirun.split() + ["-np", str(args.np), sys.executable, "-c", RANK_RSS_WRAPPER, tmp, args.zero3,
                                  "train", "--config", config_path, "--metrics", metrics,
                                  "--log-interval", "1", "--heldout-samples", "1", "--run-dir", os.path.join(tmp, "run")]
    print("+", " ".join(argv), flush=True)
    p = subprocess.run(argv, text=True, capture_output=True)
    sys.stdout.write(p.stdout[-6000:])
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-6000:])
        sys.exit(f"zero3 train failed (exit {p.returncode})")
    lines = [json.loads(line) for line in open(metrics) if line.strip()]
    rss = []
    for r in range(args.np):
        with open(os.path.join(tmp, f"rss-rank{r}.json")) as f:
            rss.append(json.load(f)["maxrss_kib"] / 1024.0)
    return lines, rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zero3", default="build-host/bin/zero3")
    ap.add_argument("--config", default="configs/llama-2.5b-nvme.json")
    ap.add_argument("--nvme-path", default="/var/tmp/zero3-nvme", help="replaces the config's nvme_path")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fio-seconds", type=int, default=20)
    ap.add_argument("--fio-size", default="4G", help="per fio job (rank)")
    ap.add_argument("--mpirun", default="mpirun --oversubscribe --allow-run-as-root --bind-to none")
    ap.add_argument("--params-on-nvme", action="store_true",
                    help="offload_param nvme too (max_in_cpu 0), under the same path")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    for tool in ("fio", "mpirun"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (tools/install-deps.sh installs it)")

    with open(args.config) as f:
        config = json.load(f)
    config["wall_clock_breakdown"] = True
    config["zero_optimization"]["offload_optimizer"]["nvme_path"] = args.nvme_path
    if args.params_on_nvme:
        config["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": args.nvme_path,
                                                        "max_in_cpu": 0}
    config["zero3"].setdefault("run", {})["steps"] = args.steps
    os.makedirs(args.nvme_path, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        # AdamW's update reads master, accumulators and two moments and writes master and moments: 4:3.
        disk = measure_disk(args.nvme_path, args.np, config, args.fio_seconds, args.fio_size, mix_read=57)
        print(f"fio on {args.nvme_path} ({args.np} jobs, io_uring, O_DIRECT, {disk['block_bytes']} B blocks, depth "
              f"{disk['queue_depth']}): write {disk['write_mb_s']:.0f} MB/s, read {disk['read_mb_s']:.0f} MB/s, "
              f"57/43 mix {disk['mixed_read_mb_s']:.0f} + {disk['mixed_write_mb_s']:.0f} MB/s", flush=True)
        lines, rss = run_job(args, config_path, tmp)

    rows = []
    for line in lines:
        d = line.get("disk")
        if not d:
            continue
        # Every rank moves the same bytes (equal shards): the disk serves np times this rank's.
        read = d["step_read_bytes"] * args.np
        write = d["step_write_bytes"] * args.np
        seconds = d["step_ms"] / 1e3
        need = read / (disk["read_mb_s"] * 1e6) + write / (disk["write_mb_s"] * 1e6)
        rows.append({"step": line["step"], "step_s": line["time_ms"]["total"] / 1e3,
                     "optimizer_s": line["time_ms"]["optimizer"] / 1e3, "disk_pass_s": seconds,
                     "wait_s": d["step_wait_ms"] / 1e3, "read_gb": read / 1e9, "write_gb": write / 1e9,
                     "gb_s": (read + write) / 1e9 / seconds, "efficiency": need / seconds,
                     "grad_write_gb": d["grad_write_bytes"] * args.np / 1e9,
                     "grad_wait_s": d["grad_wait_ms"] / 1e3,
                     "param_read_gb": d.get("param_read_bytes", 0) * args.np / 1e9,
                     "param_wait_s": d.get("param_wait_ms", 0) / 1e3})
    if not rows:
        sys.exit("no metrics line carries disk figures: is offload_optimizer.device nvme?")

    print(f"\n{args.np} ranks, {args.config}; all ranks' bytes (one disk)")
    print(f"{'step':>4} {'step s':>8} {'optim s':>8} {'disk s':>8} {'wait s':>7} {'read GB':>8} {'write GB':>8} "
          f"{'GB/s':>6} {'eff':>6} {'grad GB':>8} {'grad wait s':>11}"
          + (f" {'param GB':>8} {'param wait s':>12}" if args.params_on_nvme else ""))
    for r in rows:
        print(f"{r['step']:>4} {r['step_s']:>8.1f} {r['optimizer_s']:>8.1f} {r['disk_pass_s']:>8.1f} "
              f"{r['wait_s']:>7.1f} {r['read_gb']:>8.2f} {r['write_gb']:>8.2f} {r['gb_s']:>6.2f} "
              f"{r['efficiency']:>6.0%} {r['grad_write_gb']:>8.2f} {r['grad_wait_s']:>11.1f}"
              + (f" {r['param_read_gb']:>8.2f} {r['param_wait_s']:>12.1f}" if args.params_on_nvme else ""))
    later = rows[1:] or rows
    eff = [r["efficiency"] for r in later]
    print(f"\nthe update's disk pass at {statistics.median(eff):.0%} (range {min(eff):.0%}-{max(eff):.0%}) of the "
          f"time fio's read {disk['read_mb_s']:.0f} MB/s and write {disk['write_mb_s']:.0f} MB/s allow "
          f"(steps after the first); peak RSS per rank: " + ", ".join(f"{m:.0f} MiB" for m in rss))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"disk": disk, "steps": rows, "peak_rss_mib": rss, "config": args.config,
                       "params_on_nvme": args.params_on_nvme}, f, indent=1)


if __name__ == "__main__":
    main()
