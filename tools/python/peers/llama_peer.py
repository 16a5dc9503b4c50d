#!/usr/bin/env python3
"""zero3's Llama trained by a peer (FSDP2 or DeepSpeed ZeRO-3) on the CPU, for tokens/s and peak RSS.

The model is transformers' LlamaForCausalLM built from a LlamaConfig of the config's zero3.model shape
(layers, hidden_size, heads, kv_heads, intermediate_size, vocab_size, rope_theta, rms_norm_eps,
tie_word_embeddings; max_position_embeddings at least the context; attn_implementation="sdpa"). Batch,
AdamW hyperparameters and gradient clipping come from the config. Tokens are random: throughput does not
depend on the data.

Modes:
  fsdp2      torch.distributed.fsdp.fully_shard per decoder layer and the root, gloo; bf16 =
             MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); CPUOffloadPolicy when the config
             offloads the optimizer or the params
  deepspeed  deepspeed.initialize with the config (zero3 block dropped, "auto" resolved), DS_ACCELERATOR=cpu

Activation checkpointing (--checkpointing):
  none       every activation kept for the backward
  full       each decoder layer recomputed in the backward from its input: torch.utils.checkpoint
             (use_reentrant=False) for FSDP2, deepspeed.checkpointing.checkpoint for DeepSpeed
             (--cpu-checkpointing adds activation_checkpointing.cpu_checkpointing to DeepSpeed's config)
  selective  torchtitan's per-op policy (FSDP2 only; DeepSpeed's API has none, it is reported as skipped):
             the outputs of the matrix products and of attention are saved, the rest (norms, RoPE, SiLU,
             the elementwise products) recomputed

Run under torchrun (python -m torch.distributed.run --nproc_per_node N). Rank 0 prints one JSON line:
tokens/s over the timed steps (after --warmup steps), the first and last loss, the param count, and the
largest peak resident set size of the ranks. A run that does not fit prints {"skipped": reason} instead.
"""

import argparse
import copy
import functools
import json
import math
import os
import resource
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_config  # noqa: E402

import torch  # noqa: E402

import gpt_peer  # noqa: E402  (its AdamW, schedule and param groups: the same for every model)

CHECKPOINTING = ("none", "full", "selective")


# ---- the model ----------------------------------------------------------------------------------------------


def llama_settings(config, seq_len=None):
    """The Llama of zero3.model, with the context overridden by seq_len when given."""
    model = config.get("zero3", {}).get("model")
    if not model:
        raise ValueError("the config has no zero3.model block")
    if model.get("type") != "llama":
        raise ValueError(f"zero3.model.type is {model.get('type')!r}; llama_peer.py trains a llama")
    m = {
        "layers": int(model["layers"]),
        "hidden": int(model["hidden_size"]),
        "heads": int(model["heads"]),
        "kv_heads": int(model.get("kv_heads", model["heads"])),
        "intermediate": int(model["intermediate_size"]),
        "vocab_size": int(model["vocab_size"]),
        "seq_len": int(seq_len or model["seq_len"]),
        "config_seq_len": int(model["seq_len"]),
        "rope_theta": float(model.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(model.get("rms_norm_eps", 1e-5)),
        "tie_word_embeddings": bool(model.get("tie_word_embeddings", False)),
    }
    if m["hidden"] % m["heads"] or m["heads"] % m["kv_heads"]:
        raise ValueError(f"zero3.model: hidden {m['hidden']}, heads {m['heads']}, kv_heads {m['kv_heads']} "
                         f"do not divide")
    return m


def build_model(m):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden"],
        intermediate_size=m["intermediate"],
        num_hidden_layers=m["layers"],
        num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"],
        max_position_embeddings=max(m["seq_len"], m["config_seq_len"]),
        rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
        rms_norm_eps=m["rms_norm_eps"],
        tie_word_embeddings=m["tie_word_embeddings"],
        use_cache=False,  # training: no KV cache built in the forward
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    model.train()  # transformers checkpoints a layer only in training mode
    return model


def deepspeed_config(cfg, m, world, total_steps):
    """peers_config.deepspeed_config for a llama config.

    That helper reads the model block through peers_config.model_settings, which knows the GPT only, and
    takes only the hidden size from it (for the "auto" bucket sizes); a GPT view of the same hidden size
    gives it what it needs without a second copy of its "auto" rules.
    """
    view = copy.deepcopy(cfg)
    view["zero3"]["model"] = {"type": "gpt", "layers": m["layers"], "hidden_size": m["hidden"],
                              "heads": m["heads"], "vocab_size": m["vocab_size"], "seq_len": m["seq_len"]}
    return peers_config.deepspeed_config(view, world, total_steps)


# ---- activation checkpointing ---------------------------------------------------------------------------


def selective_policy_ops():
    """The ops whose outputs the selective policy saves: the products and attention (those present)."""
    names = [("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"),
             ("aten", "_scaled_dot_product_flash_attention"),
             ("aten", "_scaled_dot_product_efficient_attention"),
             ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
             ("aten", "_scaled_dot_product_cudnn_attention")]
    ops = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.add(packet.default)
    return ops


def selective_context_fn():
    """torch.utils.checkpoint's context_fn for the selective mode (torchtitan's per-op policy)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = selective_policy_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def enable_torch_checkpointing(model, mode):
    """Each decoder layer under torch.utils.checkpoint (use_reentrant=False), whole or per-op selective.

    transformers wraps the layer's forward, not its __call__, so FSDP2's hooks stay outside the checkpoint
    and the recompute does not all-gather again; call it before fully_shard.
    """
    kwargs = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = selective_context_fn()
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def enable_deepspeed_checkpointing(model, ds_cfg):
    """Each decoder layer under deepspeed.checkpointing.checkpoint, configured from ds_cfg.

    transformers' public switch builds its checkpoint function from torch.utils.checkpoint only, so the
    function is handed to _set_gradient_checkpointing, the method that switch ends in. DeepSpeed's
    checkpoint is reentrant: the layer input must require grad, which enable_input_require_grads ensures.
    """
    import deepspeed

    deepspeed.checkpointing.configure(None, deepspeed_config=ds_cfg)
    model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
    model.enable_input_require_grads()


# ---- the two trainers; each returns (model, step(batches) -> loss, precision, checkpointing) ----------------


def fsdp2_trainer(args, cfg, m, gas, bf16):
    from torch.distributed.fsdp import fully_shard

    model = build_model(m)
    what_ckpt = "none"
    if args.checkpointing != "none":
        enable_torch_checkpointing(model, args.checkpointing)
        what_ckpt = "torch.utils.checkpoint(use_reentrant=False) per decoder layer"
        if args.checkpointing == "selective":
            what_ckpt += ", selective: saves " + ", ".join(sorted(str(op) for op in selective_policy_ops()))
    kwargs, what = gpt_peer.fsdp2_policies(cfg, bf16)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)  # the root: embeddings (tied to lm_head when configured), final norm, lm_head
    optimizer, sched, clip = gpt_peer.torch_optimizer(args, cfg, model)
    # gpt_peer's loss over transformers' logits: every position predicts the next token, in fp32.
    step = gpt_peer.fsdp2_step(model, optimizer, sched, clip, gas, lambda ids: model(input_ids=ids).logits)
    return model, step, what, what_ckpt


def deepspeed_trainer(args, cfg, m, gas, bf16):
    import deepspeed

    world = torch.distributed.get_world_size()
    ds_cfg = deepspeed_config(cfg, m, world, args.warmup + args.steps)
    if args.cpu_checkpointing:
        ds_cfg.setdefault("activation_checkpointing", {})["cpu_checkpointing"] = True
    model = build_model(m)
    what_ckpt = "none"
    if args.checkpointing == "full":
        enable_deepspeed_checkpointing(model, ds_cfg)
        what_ckpt = "deepspeed.checkpointing.checkpoint per decoder layer"
        if args.cpu_checkpointing:
            what_ckpt += ", activation_checkpointing.cpu_checkpointing"
    opt_params = peers_config.optimizer_params(cfg)
    groups = gpt_peer.param_groups(model, opt_params["weight_decay"])
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_cfg)
    offload_opt, offload_param = peers_config.offloads(cfg)

    def step(batches):
        total_loss = 0.0
        for b in batches:
            loss = gpt_peer.loss_of(engine(input_ids=b[:, :-1]).logits, b[:, 1:])
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
    return model, step, what, what_ckpt


TRAINERS = {"fsdp2": fsdp2_trainer, "deepspeed": deepspeed_trainer}


# ---- out of memory --------------------------------------------------------------------------------------


def out_of_memory(error):
    """Whether an exception is an allocation failure (torch's CPU allocator raises a plain RuntimeError)."""
    if isinstance(error, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def peer_left(error):
    """Whether a collective failed because another rank's connection closed (gloo's messages)."""
    text = str(error)
    return isinstance(error, RuntimeError) and ("closed by peer" in text or "reset by peer" in text)


def skip(reason):
    print(json.dumps({"skipped": reason}), flush=True)


def peak_rss_kib():
    """This process's peak resident set size, KiB: VmHWM, the high-water mark of its own address space.

    getrusage(RUSAGE_SELF).ru_maxrss would also do, but Linux carries the high-water mark of the address
    space an exec replaces into it: a torchrun worker's starts at torchrun's own RSS (torch imported, about
    630 MiB with the CUDA build of torch). It is the fallback where /proc is not there.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def largest_over_ranks_mib(values_kib):
    """Each of the values (KiB), the largest over the ranks, in MiB."""
    kib = torch.tensor(values_kib, dtype=torch.int64)
    torch.distributed.all_reduce(kib, op=torch.distributed.ReduceOp.MAX)
    return [int(v) / 1024.0 for v in kib.tolist()]


# ---- main -----------------------------------------------------------------------------------------------


def unsupported_variant(args):
    """Why DeepSpeed cannot run the asked-for checkpointing variant here, or None."""
    if args.mode != "deepspeed":
        return None
    if args.checkpointing == "selective":
        return ("DeepSpeed offers no selective (per-op) activation checkpointing: its checkpoint recomputes "
                "the whole function")
    if args.cpu_checkpointing:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() == "cpu":
            # With cpu_checkpointing on a synchronized accelerator, CheckpointFunction keeps
            # copy_to_device(input, cpu) and then empties the input (get_cpu_activations_for_backward). On
            # the CPU accelerator that copy is the input itself (.to("cpu") aliases), so the backward
            # recomputes the layer from a 0-dim tensor and fails ("Dimension out of range").
            return ("DeepSpeed's cpu_checkpointing fails on its CPU accelerator: the 'copy' to the CPU aliases "
                    "the layer input it then empties, and the backward recomputes from an empty tensor")
    return None


def train(args, cfg, m, rank, world, bf16):
    """Builds the trainer and runs the steps; returns the result line's fields (rank 0's timings)."""
    train_batch, micro, gas = peers_config.resolve_batch(cfg, world)
    model, step, precision, what_ckpt = TRAINERS[args.mode](args, cfg, m, gas, bf16)
    if args.mode == "deepspeed":  # ZeRO-3 leaves each param's full size in ds_numel
        counted = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    else:  # DTensor shards: the global shape
        counted = sum(math.prod(p.shape) for p in model.parameters())

    g = torch.Generator().manual_seed(1000 + rank)
    batches = [torch.randint(0, m["vocab_size"], (micro, m["seq_len"] + 1), generator=g) for _ in range(2 * gas)]
    losses, times = [], []
    timed_start = None
    for s in range(args.warmup + args.steps):
        if s == args.warmup:  # the timed window starts and ends with every rank at a barrier
            torch.distributed.barrier()
            timed_start = time.perf_counter()
        chunk = [batches[(s * gas + i) % len(batches)] for i in range(gas)]
        t0 = time.perf_counter()
        losses.append(step(chunk))
        times.append(time.perf_counter() - t0)
    torch.distributed.barrier()
    elapsed = time.perf_counter() - timed_start
    tokens_per_step = world * micro * gas * m["seq_len"]  # every position predicts, as zero3 counts
    return {
        "precision": precision, "checkpointing_impl": what_ckpt, "params": counted,
        "train_batch_size": train_batch, "micro": micro, "accumulation": gas,
        "tokens_per_s": tokens_per_step * args.steps / elapsed,
        "step_ms_median": statistics.median(times[args.warmup:]) * 1e3,
        "loss_first": losses[0], "loss_last": losses[-1],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=sorted(TRAINERS))
    ap.add_argument("--config", default="configs/smollm-135m.json")
    ap.add_argument("--seq-len", type=int, default=0, help="the context; 0 = the config's zero3.model.seq_len")
    ap.add_argument("--checkpointing", choices=CHECKPOINTING, default="none")
    ap.add_argument("--cpu-checkpointing", action="store_true",
                    help="DeepSpeed, with --checkpointing full: activation_checkpointing.cpu_checkpointing true")
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps (at least 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps before them")
    ap.add_argument("--adamw", choices=["fused", "foreach"], default="fused",
                    help="torch.optim.AdamW implementation (fsdp2 mode)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank; 0 = cores / local ranks")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be at least 1, --warmup at least 0")
    if args.cpu_checkpointing and (args.mode != "deepspeed" or args.checkpointing != "full"):
        ap.error("--cpu-checkpointing is DeepSpeed's: it needs the deepspeed mode and --checkpointing full")

    cfg = peers_config.load_config(args.config)
    m = llama_settings(cfg, args.seq_len)
    if peers_config.fp16_enabled(cfg):
        raise SystemExit("llama_peer.py: fp16 configs are not benchmarked (bf16 or fp32 only)")
    unsupported = unsupported_variant(args)
    if unsupported:
        # Decided before any process group exists: every rank exits alike, rank 0 says why.
        if os.environ.get("RANK", "0") == "0":
            skip(unsupported)
        return 0

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
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // local)
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    bf16 = peers_config.bf16_enabled(cfg)

    # The interpreter, torch, transformers (and DeepSpeed) with the process group up, before the model: what
    # every peer run holds whatever its model, and zero3's processes do not.
    start_kib = peak_rss_kib()
    try:
        result = train(args, cfg, m, rank, world, bf16)
    except Exception as error:  # noqa: BLE001 -- only an allocation failure (or its echo) is handled
        if out_of_memory(error):
            # The other ranks wait in a collective this rank will never join: say why and leave at once.
            traceback.print_exc()
            skip(f"out of memory on rank {rank} at context {m['seq_len']}, checkpointing {args.checkpointing}: "
                 f"{str(error).splitlines()[0][:200]}")
        elif peer_left(error):
            # Another rank left in the middle of a collective. One that ran out of memory printed the skipped
            # line and exited 0, as this rank does now; one that failed otherwise exits non-zero itself, and
            # torchrun reports that.
            traceback.print_exc()
        else:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    rss, start_rss = largest_over_ranks_mib([peak_rss_kib(), start_kib])
    if rank == 0:
        checkpointing = args.checkpointing + ("+cpu" if args.cpu_checkpointing else "")
        print(json.dumps({
            "contestant": args.mode, "world": world, "threads": threads, "backend": backend,
            "seq_len": m["seq_len"], "checkpointing": checkpointing, **result,
            "steps": args.steps, "warmup": args.warmup, "peak_rss_mib": rss, "start_rss_mib": start_rss,
        }), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    # Leave without the interpreter's shutdown: gloo's worker thread may still be releasing the tensor of
    # the last all_reduce (largest_over_ranks_mib's), which takes the GIL, and a thread that takes the GIL
    # during the shutdown aborts the process ("terminate called without an active exception": 1 run in 4
    # here). Everything this script writes is flushed by then.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
