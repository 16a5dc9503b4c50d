#!/usr/bin/env python3
"""The CPU optimizer step of zero3's peers at the sizes of `zero3-bench cpu-optimizer`, one JSON line each.

One flat fp32 parameter (what a ZeRO-Offload sub-group is) with an fp32 gradient, AdamW with DeepSpeed's
defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01), after one untimed step; the best of
--repeats steps. Variants:
  torch_fused     torch.optim.AdamW(fused=True)
  torch_foreach   torch.optim.AdamW(foreach=True)
  ds_cpu_adam     deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode): the optimizer pass alone
  ds_offload      DeepSpeed ZeRO-3's whole CPU-offload step for a 16-bit model, as runtime/zero/stage3.py
                  runs it: the global grad norm (_constant_buffered_norm2, 250M-element chunks, fp32), the
                  unscale + clip multiply (unscale_and_clip_grads: grads *= 1 / max(1, (norm + 1e-6) / clip),
                  always run), DeepSpeedCPUAdam.step over the fp32 master and states, then the copy of the
                  master into the bf16 param partition (_reassign_or_swap_out_partitioned_parameters)
Figures: Gparam/s, and GB/s at 28 bytes/param (fp32 grad, master, exp_avg, exp_avg_sq loaded; master and
the two states stored): the optimizer's own streams, the same count for every variant.
"""

import argparse
import gc
import json
import os
import sys
import time

BYTES_PER_PARAM = 28
VARIANTS = ("torch_fused", "torch_foreach", "ds_cpu_adam", "ds_offload")
LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.999), 1e-8, 0.01, 1.0


def parse_count(text):
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}.get(text[-1:].lower(), 1)
    value = float(text[:-1] if mult != 1 else text) * mult
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a parameter count: {text}")
    return int(value)


def available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def needed_bytes(variant, n):
    # param, grad, two states; torch's unfused steps keep about two temporaries; ds_offload the bf16 copy.
    return n * {"torch_fused": 16, "torch_foreach": 24, "ds_cpu_adam": 16, "ds_offload": 18}[variant]


class Step:
    """One variant's buffers and its step(); built once per size, freed before the next."""

    def __init__(self, torch, variant, n):
        self.torch, self.variant, self.n = torch, variant, n
        g = torch.Generator().manual_seed(n)
        # Gradients of 1e-5 keep the norm below the clip (factor 1), so repeats see the same values.
        self.master = (torch.rand(n, generator=g) * 0.1 - 0.05).requires_grad_()
        self.master.grad = torch.rand(n, generator=g) * 2e-5 - 1e-5
        self.build_seconds = None
        if variant.startswith("torch_"):
            kind = {"fused": True} if variant == "torch_fused" else {"foreach": True}
            self.opt = torch.optim.AdamW([self.master], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kind)
        else:
            t0 = time.perf_counter()
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            self.opt = DeepSpeedCPUAdam([self.master], lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                        adamw_mode=True)
            self.build_seconds = time.perf_counter() - t0  # the JIT build of cpu_adam, or loading it when cached
        self.bf16 = torch.empty(n, dtype=torch.bfloat16) if variant == "ds_offload" else None

    def grad_norm(self):
        torch = self.torch
        total = None
        for part in self.master.grad.view(-1).split(250_000_000):
            sq = part.to(torch.float32).norm(2) ** 2.0
            total = sq if total is None else total + sq
        return total ** 0.5

    def __call__(self):
        torch = self.torch
        if self.variant != "ds_offload":
            t0 = time.perf_counter()
            self.opt.step()
            return time.perf_counter() - t0, {}
        split = {}
        t0 = time.perf_counter()
        norm = self.grad_norm()
        t1 = time.perf_counter()
        loss_scale = 1.0  # bf16: DeepSpeed's static scale of 1
        clip = torch.clamp(((norm / loss_scale) + 1e-6) / CLIP, min=1.0)
        self.master.grad.mul_(1.0 / (clip * loss_scale))
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        self.bf16.data.copy_(self.master.data)
        t4 = time.perf_counter()
        split = {"norm_ms": (t1 - t0) * 1e3, "unscale_clip_ms": (t2 - t1) * 1e3, "adam_ms": (t3 - t2) * 1e3,
                 "cast_bf16_ms": (t4 - t3) * 1e3}
        return t4 - t0, split


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=lambda s: [parse_count(t) for t in s.split(",") if t],
                    default=[10**7, 10**8, 10**9], help="comma-separated counts (10M, 100M, 1B); default 10M,100M,1B")
    ap.add_argument("--variants", type=lambda s: [t for t in s.split(",") if t], default=list(VARIANTS),
                    help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--threads", type=int, default=2, help="torch (and OpenMP) threads")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per variant and size; the best is reported")
    args = ap.parse_args()
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # DeepSpeedCPUAdam's loops are OpenMP
    if any(v.startswith("ds_") for v in args.variants):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    torch.set_num_threads(args.threads)
    for n in args.params:
        for variant in args.variants:
            need = needed_bytes(variant, n)
            avail = available_bytes()
            if avail is not None and need + max(1 << 30, avail // 10) > avail:
                print(json.dumps({"variant": variant, "params": n, "skipped":
                                  f"needs about {need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available"}),
                      flush=True)
                continue
            with torch.no_grad():
                step = Step(torch, variant, n)
                step()  # allocates the states, faults the pages in
                best, best_split = float("inf"), {}
                for _ in range(args.repeats):
                    t, split = step()
                    if t < best:
                        best, best_split = t, split
            line = {"variant": variant, "params": n, "threads": args.threads, "repeats": args.repeats,
                    "statistic": "best", "step_ms": best * 1e3, "gparams_per_s": n / best / 1e9,
                    "gbps": n * BYTES_PER_PARAM / best / 1e9, "bytes_per_param": BYTES_PER_PARAM}
            if best_split:
                line["split_ms"] = best_split
            if step.build_seconds is not None:
                line["cpu_adam_load_s"] = step.build_seconds
            print(json.dumps(line), flush=True)
            del step
            gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
