#!/usr/bin/env python3
"""zero3's GPT trained by a peer (plain PyTorch, FSDP2 or DeepSpeed ZeRO-3) on the CPU, for tokens/s.

The model is the one `zero3 train` builds from the config's zero3.model block (runtime/models/gpt.cpp):
GPT-2 style pre-LayerNorm blocks (eps 1e-5), a fused qkv projection with bias, the tanh GELU, an MLP of
mlp_ratio x hidden, learned position embeddings, an untied lm_head without bias; init normal(0.02),
positions normal(0.01), the two residual projections normal(0.02 / sqrt(2 layers)); no weight decay on
biases and LayerNorm params. Batch, AdamW hyperparameters and gradient clipping come from the config.
Tokens are random: throughput does not depend on the data.

Modes:
  torch      one process, plain PyTorch; bf16 = torch.autocast("cpu", torch.bfloat16) over fp32 params
  fsdp2      torch.distributed.fsdp.fully_shard per block and the root, gloo; bf16 =
             MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); CPUOffloadPolicy when the config
             offloads the optimizer or the params
  deepspeed  deepspeed.initialize with the config (zero3 block dropped, "auto" resolved), DS_ACCELERATOR=cpu

Multi-rank modes run under torchrun (python -m torch.distributed.run --nproc_per_node N). Rank 0 prints
one JSON line: tokens/s over the timed steps (after --warmup steps), the step times, the first and last loss.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_config  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

INIT_STD = 0.02
POSITION_INIT_STD = 0.01
LAYERNORM_EPS = 1e-5


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, f = m["hidden"], m["mlp_ratio"] * m["hidden"]
        self.heads = m["heads"]
        self.ln1 = nn.LayerNorm(d, eps=LAYERNORM_EPS)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=LAYERNORM_EPS)
        self.fc = nn.Linear(d, f)
        self.mlp_proj = nn.Linear(f, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        # Rows of qkv: q, then k, then v; head h owns rows h * head_dim .. of each (as zero3's layout).
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        d = m["hidden"]
        self.wte = nn.Embedding(m["vocab_size"], d)
        self.wpe = nn.Embedding(m["seq_len"], d)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(d, eps=LAYERNORM_EPS)
        self.lm_head = nn.Linear(d, m["vocab_size"], bias=False)
        residual_std = INIT_STD / math.sqrt(2 * m["layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name == "wpe.weight":
                    p.normal_(0.0, POSITION_INIT_STD)
                elif name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight"):
                    p.normal_(0.0, residual_std)
                elif p.dim() == 2:
                    p.normal_(0.0, INIT_STD)
                elif name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_f.weight":
                    p.fill_(1.0)
                else:
                    p.zero_()

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def param_groups(model, weight_decay):
    """zero3's rule: matrices (weights and embeddings) decay, biases and LayerNorm params do not."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_decay(step, warmup, total):
    """DeepSpeed's WarmupDecayLR factor (log warm-up, then linear decay), for the non-DeepSpeed modes."""
    if step < warmup:
        return math.log(step + 1) / math.log(warmup) if warmup > 1 else 1.0
    return max(0.0, (total - step) / max(1.0, total - warmup))


def loss_of(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_batches(m, micro, count, rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, m["vocab_size"], (micro, m["seq_len"] + 1), generator=g) for _ in range(count)]


def adamw(params, opt, fused):
    kwargs = {"lr": opt["lr"], "betas": opt["betas"], "eps": opt["eps"]}
    if fused:
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = True
    return torch.optim.AdamW(params, **kwargs)


# ---- the three trainers; each returns step(batches) -> loss -----------------------------------------------


def torch_optimizer(args, cfg, model):
    """The torch and FSDP2 trainers' AdamW, WarmupDecayLR-shaped schedule and clipping, from the config."""
    opt_params = peers_config.optimizer_params(cfg)
    optimizer = adamw(param_groups(model, opt_params["weight_decay"]), opt_params, args.adamw == "fused")
    total = args.warmup + args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_decay(s, 10, total))
    return optimizer, sched, peers_config.gradient_clipping(cfg)


def torch_trainer(args, cfg, m, gas, bf16):
    model = GPT(m)
    optimizer, sched, clip = torch_optimizer(args, cfg, model)

    def step(batches):
        total_loss = 0.0
        for b in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(b[:, :-1])
            loss = loss_of(logits, b[:, 1:]) / gas
            loss.backward()
            total_loss += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        sched.step()
        optimizer.zero_grad(set_to_none=True)
        return total_loss

    return model, step, "autocast(cpu, bfloat16) over fp32 params" if bf16 else "fp32"


def fsdp2_policies(cfg, bf16):
    """fully_shard's keyword arguments for the config (bf16 mixed precision, CPU offload), and how they read."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    offload_opt, offload_param = peers_config.offloads(cfg)
    kwargs = {}
    what = "fp32"
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        what = "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)"
    if offload_opt or offload_param:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        what += ", CPUOffloadPolicy(pin_memory=False)"
    return kwargs, what


def fsdp2_step(model, optimizer, sched, clip, gas, logits_of):
    """One optimizer step of an FSDP2 model over a step's micro-batches; the gradient is reduced on the last."""

    def step(batches):
        total_loss = 0.0
        for i, b in enumerate(batches):
            model.set_requires_gradient_sync(i == len(batches) - 1)
            loss = loss_of(logits_of(b[:, :-1]), b[:, 1:]) / gas
            loss.backward()
            total_loss += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        sched.step()
        optimizer.zero_grad(set_to_none=True)
        return total_loss

    return step


def fsdp2_trainer(args, cfg, m, gas, bf16):
    from torch.distributed.fsdp import fully_shard

    model = GPT(m)
    kwargs, what = fsdp2_policies(cfg, bf16)
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    optimizer, sched, clip = torch_optimizer(args, cfg, model)
    return model, fsdp2_step(model, optimizer, sched, clip, gas, model), what


def deepspeed_trainer(args, cfg, m, gas, bf16):
    import deepspeed

    world = torch.distributed.get_world_size()
    ds_cfg = peers_config.deepspeed_config(cfg, world, args.warmup + args.steps)
    model = GPT(m)
    opt_params = peers_config.optimizer_params(cfg)
    groups = param_groups(model, opt_params["weight_decay"])
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_cfg)
    offload_opt, offload_param = peers_config.offloads(cfg)

    def step(batches):
        total_loss = 0.0
        for b in batches:
            loss = loss_of(engine(b[:, :-1]), b[:, 1:])
            engine.backward(loss)  # DeepSpeed divides by the accumulation steps itself
            engine.step()  # an optimizer step only at the accumulation boundary
            total_loss += loss.item() / gas
        return total_loss

    what = "bf16 params and compute, fp32 master (bf16.enabled)" if bf16 else "fp32"
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # ZeRO-3 wraps the basic optimizer
    what += f", ZeRO-3, optimizer {type(inner).__name__}"
    zero = ds_cfg.get("zero_optimization", {})
    if offload_opt:
        what += f", offload_optimizer {zero['offload_optimizer']['device']}"
    if offload_param:
        what += f", offload_param {zero['offload_param']['device']}"
    return model, step, what


TRAINERS = {"torch": torch_trainer, "fsdp2": fsdp2_trainer, "deepspeed": deepspeed_trainer}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=sorted(TRAINERS))
    ap.add_argument("--config", default="configs/gpt-small.json")
    ap.add_argument("--steps", type=int, default=12, help="timed optimizer steps (at least 1)")
    ap.add_argument("--warmup", type=int, default=4, help="untimed optimizer steps before them")
    ap.add_argument("--fp32", action="store_true", help="ignore the config's bf16 block")
    ap.add_argument("--adamw", choices=["fused", "foreach"], default="fused",
                    help="torch.optim.AdamW implementation (torch and fsdp2 modes)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank; 0 = cores / local ranks")
    args = ap.parse_args()

    cfg = peers_config.load_config(args.config)
    m = peers_config.model_settings(cfg)
    distributed = args.mode != "torch"
    if distributed:
        backend = "gloo"
        if args.mode == "deepspeed":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed picks an accelerator
            import deepspeed

            deepspeed.init_distributed(dist_backend=None)  # the CPU accelerator's choice: ccl if installed, else gloo
            backend = torch.distributed.get_backend()
        else:
            torch.distributed.init_process_group(backend)
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        rank, world, local, backend = 0, 1, 1, None
    cores = len(os.sched_getaffinity(0))
    threads = args.threads or max(1, cores // local)
    torch.set_num_threads(threads)
    torch.manual_seed(1)

    bf16 = peers_config.bf16_enabled(cfg) and not args.fp32
    if args.fp32:
        cfg = peers_config.in_fp32(cfg)
    if peers_config.fp16_enabled(cfg):
        raise SystemExit("gpt_peer.py: fp16 configs are not benchmarked (bf16 or fp32 only)")
    train, micro, gas = peers_config.resolve_batch(cfg, world)
    model, step, precision = TRAINERS[args.mode](args, cfg, m, gas, bf16)
    formula = peers_config.gpt_param_count(m)
    if args.mode == "deepspeed":  # ZeRO-3 leaves each param's full size in ds_numel
        counted = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    elif args.mode == "fsdp2":  # DTensor shards: the global shape
        counted = sum(math.prod(p.shape) for p in model.parameters())
    else:
        counted = sum(p.numel() for p in model.parameters())

    batches = make_batches(m, micro, 4 * gas, rank)
    losses, times = [], []
    timed_start = None
    for s in range(args.warmup + args.steps):
        if s == args.warmup:  # the timed window starts and ends with every rank at a barrier
            if distributed:
                torch.distributed.barrier()
            timed_start = time.perf_counter()
        chunk = [batches[(s * gas + i) % len(batches)] for i in range(gas)]
        t0 = time.perf_counter()
        losses.append(step(chunk))
        times.append(time.perf_counter() - t0)
    if distributed:
        torch.distributed.barrier()
    elapsed = time.perf_counter() - timed_start
    timed = times[args.warmup:]
    tokens_per_step = train * m["seq_len"]  # every position predicts, as zero3 counts
    if rank == 0:
        print(json.dumps({
            "contestant": args.mode, "world": world, "threads": threads, "backend": backend,
            "precision": precision, "adamw": args.adamw if args.mode != "deepspeed" else "deepspeed",
            "params": counted, "params_formula": formula,
            "train_batch_size": train, "micro": micro, "accumulation": gas,
            "steps": args.steps, "warmup": args.warmup,
            "tokens_per_s": tokens_per_step * args.steps / elapsed,
            "step_ms_median": statistics.median(timed) * 1e3,
            "loss_first": losses[0], "loss_last": losses[-1],
        }), flush=True)
    if counted != formula:
        print(f"gpt_peer.py: the model has {counted} params, zero3's formula {formula}", file=sys.stderr)
        return 1
    if distributed:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
