#!/usr/bin/env python3
"""Times torch.optim.AdamW's CPU step at the sizes and thread count of `zero3-bench cpu-optimizer`.

One flat fp32 parameter (what a ZeRO-Offload sub-group is) with an fp32 gradient; no 16-bit copy. Variants:
"default" (what torch picks for CPU tensors), "foreach" (foreach=True) and "fused" (fused=True, where this
torch supports it on CPU for the dtype). Reports the best of --repeats steps per variant, after one untimed step.
--dtype bf16 times a bf16 parameter and gradient instead: torch keeps the moments in the parameter's dtype, so
that is the counterpart of zero3's bf16 master weights with bf16 optimizer states (`--states bf16-master-states`).
With --json prints {"results": [{"params", "threads", "torch_gparams_per_s", "variant", "dtype"}, ...]}, which
`zero3-bench cpu-optimizer --torch-json FILE` merges into its table (fp32 entries) and its storage variants
(bf16 entries).
"""

import argparse
import gc
import json
import os
import sys
import time

SKIP_MESSAGE = "torch not installed: skipping torch.optim.AdamW baseline"


def parse_count(text):
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}.get(text[-1:].lower(), 1.0)
    num = text[:-1] if mult != 1.0 else text
    value = float(num) * mult
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a parameter count: {text}")
    return int(value)


def parse_counts(text):
    return [parse_count(t.strip()) for t in text.split(",") if t.strip()]


def label(n):
    for div, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=parse_counts, default=[10**7, 10**8, 10**9],
                    help="comma-separated parameter counts (100003, 10M, 1B); default 10M,100M,1B")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = every core of the process")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per variant; the best is reported")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="parameter, gradient and moment dtype (torch keeps moments in the parameter's dtype)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        # Under --json the output must stay JSON: the message goes to stderr, an empty result list to stdout.
        if args.json:
            print(SKIP_MESSAGE, file=sys.stderr)
            print(json.dumps({"results": []}))
        else:
            print(SKIP_MESSAGE)
        return 0

    threads = args.threads if args.threads > 0 else len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    variants = [("default", {}), ("foreach", {"foreach": True})]
    try:
        probe = torch.zeros(16, dtype=dtype, requires_grad=True)
        probe.grad = torch.zeros(16, dtype=dtype)
        torch.optim.AdamW([probe], fused=True).step()
        variants.append(("fused", {"fused": True}))
    except (RuntimeError, TypeError, ValueError) as e:
        print(f"note: torch {torch.__version__} has no fused AdamW on CPU for {args.dtype} ({e})", file=sys.stderr)

    results, skipped = [], []
    for n in args.params:
        # param, grad, exp_avg, exp_avg_sq, plus the temporaries of the unfused step (about two tensors).
        need = n * dtype.itemsize * 6
        avail = available_bytes()
        if avail is not None and need + max(1 << 30, avail // 10) > avail:
            reason = f"needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"
            print(f"{label(n)} params skipped: {reason}", file=sys.stderr)
            skipped.append({"params": n, "reason": reason})
            continue
        for name, kwargs in variants:
            p = torch.empty(n, dtype=dtype).uniform_(-0.05, 0.05).requires_grad_()
            p.grad = torch.empty(n, dtype=dtype).uniform_(-1e-5, 1e-5)
            opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kwargs)
            with torch.no_grad():
                opt.step()  # allocates the moments
                best = float("inf")
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    opt.step()
                    best = min(best, time.perf_counter() - t0)
            results.append({"params": n, "threads": threads, "torch_gparams_per_s": n / best / 1e9,
                            "variant": name, "step_ms": best * 1e3, "dtype": args.dtype})
            del opt, p
            gc.collect()

    if args.json:
        doc = {"results": results}
        if skipped:
            doc["skipped"] = skipped
        print(json.dumps(doc))
        return 0
    print(f"torch {torch.__version__} AdamW, {args.dtype} param, grad and moments, {threads} threads, "
          f"best of {args.repeats} steps")
    print(f"{'params':>8} {'threads':>7} {'variant':>8} {'step ms':>10} {'Gparam/s':>9}")
    for r in results:
        print(f"{label(r['params']):>8} {r['threads']:>7} {r['variant']:>8} {r['step_ms']:>10.2f} "
              f"{r['torch_gparams_per_s']:>9.3f}")
    for s in skipped:
        print(f"{label(s['params']):>8} skipped: {s['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
