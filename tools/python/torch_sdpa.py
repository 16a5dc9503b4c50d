#!/usr/bin/env python3
"""Times torch's scaled_dot_product_attention (causal) forward and backward on the CPU at the shape of
`zero3-bench attention`, once per dtype, and prints one JSON line:
{"torch": "2.x", "results": [{"dtype": "bf16", "forward_s": .., "backward_s": ..}, ...]}.
q, k and v are [batch, heads, len, head_dim] as transformers' Llama passes them after repeating the kv heads.
One untimed call of each first at a length of at most 1,024 (torch's first calls pay their set-up: dispatch, and
the bf16 kernels' code generation).
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--len", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="bf16,fp32")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print(json.dumps({"torch": None, "results": []}))
        return 0
    torch.set_num_threads(args.threads)
    kinds = {"bf16": torch.bfloat16, "fp32": torch.float32}
    out = {"torch": torch.__version__, "results": []}
    for name in args.dtypes.split(","):
        if name not in kinds:
            sys.exit(f"--dtypes: unknown dtype {name!r} (bf16, fp32)")
        dtype = kinds[name]
        gen = torch.Generator().manual_seed(1)

        def tensors(length):
            shape = (args.batch, args.heads, length, args.head_dim)
            return [torch.randn(shape, generator=gen, dtype=dtype).requires_grad_() for _ in range(3)]

        q, k, v = tensors(min(args.len, 1024))
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        q, k, v = tensors(args.len)
        grad = torch.randn((args.batch, args.heads, args.len, args.head_dim), generator=gen, dtype=dtype)
        t0 = time.perf_counter()
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        o.backward(grad)
        t2 = time.perf_counter()
        out["results"].append({"dtype": name, "forward_s": t1 - t0, "backward_s": t2 - t1})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
