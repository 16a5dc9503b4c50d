"""Reading a zero3 config for the peer benchmarks: the model block, the batch rule, the derived configs.

Standard library only, so the driver can use it before it knows whether torch is installed.
"""

import copy
import json


def load_config(path):
    """A DeepSpeed JSON config (with zero3's "zero3" block); hjson when plain JSON does not parse."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as json_error:
        try:
            import hjson  # DeepSpeed reads configs with hjson; accept what it accepts
        except ImportError:
            raise ValueError(f"{path}: not JSON ({json_error}) and hjson is not installed") from json_error
        return json.loads(json.dumps(hjson.loads(text)))


def model_settings(config):
    """The GPT of zero3.model: vocab, context, layers, hidden, heads, mlp_ratio (4 unless given)."""
    model = config.get("zero3", {}).get("model")
    if not model:
        raise ValueError("the config has no zero3.model block")
    if model.get("type", "gpt") != "gpt":
        raise ValueError(f"zero3.model.type is {model.get('type')!r}; the peers implement the gpt only")
    m = {
        "vocab_size": int(model["vocab_size"]),
        "seq_len": int(model["seq_len"]),
        "layers": int(model["layers"]),
        "hidden": int(model["hidden_size"]),
        "heads": int(model["heads"]),
        "mlp_ratio": int(model.get("mlp_ratio", 4)),
    }
    if m["hidden"] % m["heads"]:
        raise ValueError(f"zero3.model.hidden_size ({m['hidden']}) is not a multiple of heads ({m['heads']})")
    return m


def gpt_param_count(m):
    """Elements of every param of zero3's GPT (runtime/models/gpt.cpp gpt_units), by formula."""
    d, f, v, s, layers = m["hidden"], m["mlp_ratio"] * m["hidden"], m["vocab_size"], m["seq_len"], m["layers"]
    embed = v * d + s * d
    block = (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (2 * d) + (f * d + f) + (d * f + d)
    head = 2 * d + v * d  # ln_f and the untied lm_head, no bias
    return embed + layers * block + head


def _given(config, key):
    value = config.get(key)
    return None if value is None or value == "auto" else int(value)


def resolve_batch(config, world):
    """DeepSpeed's batch rule: train = micro * accumulation * world, any two given; returns the three."""
    train = _given(config, "train_batch_size")
    micro = _given(config, "train_micro_batch_size_per_gpu")
    gas = _given(config, "gradient_accumulation_steps")
    if train is not None and micro is not None:
        if train % (micro * world):
            raise ValueError(f"train_batch_size {train} is not a multiple of micro {micro} x world {world}")
        gas = train // (micro * world)
    elif train is not None and gas is not None:
        if train % (gas * world):
            raise ValueError(f"train_batch_size {train} is not a multiple of accumulation {gas} x world {world}")
        micro = train // (gas * world)
    elif micro is not None:
        gas = gas or 1
        train = micro * gas * world
    elif train is not None:
        gas = 1
        micro = train // world
    else:
        raise ValueError("the config gives neither train_batch_size nor train_micro_batch_size_per_gpu")
    if min(train, micro, gas) < 1 or train != micro * gas * world:
        raise ValueError(f"inconsistent batch: train {train}, micro {micro}, accumulation {gas}, world {world}")
    return train, micro, gas


def bf16_enabled(config):
    return bool(config.get("bf16", {}).get("enabled", False)) or bool(config.get("bfloat16", {}).get("enabled", False))


def fp16_enabled(config):
    return bool(config.get("fp16", {}).get("enabled", False))


def offloads(config):
    """(optimizer, params): whether zero_optimization offloads each to the CPU."""
    zero = config.get("zero_optimization", {})

    def on(key):
        block = zero.get(key) or {}
        return block.get("device", "none") in ("cpu", "nvme")

    return on("offload_optimizer"), on("offload_param")


def optimizer_params(config):
    """AdamW's lr, betas, eps, weight_decay from the config's optimizer block (DeepSpeed's defaults)."""
    opt = config.get("optimizer", {})
    kind = opt.get("type", "AdamW")
    if kind.lower() not in ("adamw", "adam"):
        raise ValueError(f"optimizer.type {kind!r}: the peers run AdamW only")
    p = opt.get("params", {})
    lr = p.get("lr", 1e-3)
    if lr == "auto":
        lr = 1e-3
    betas = p.get("betas", [0.9, 0.999])
    if betas == "auto":
        betas = [0.9, 0.999]
    eps = p.get("eps", 1e-8)
    wd = p.get("weight_decay", 0.01)
    return {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])),
            "eps": 1e-8 if eps == "auto" else float(eps), "weight_decay": 0.0 if wd == "auto" else float(wd)}


def gradient_clipping(config):
    clip = config.get("gradient_clipping", 0.0)
    return 1.0 if clip == "auto" else float(clip)


# ---- derived configs ------------------------------------------------------------------------------------


def without_offload(config):
    """The same run with nothing offloaded (zero_optimization's offload blocks removed)."""
    c = copy.deepcopy(config)
    zero = c.get("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    zero.pop("offload_param", None)
    return c


def in_fp32(config):
    """The same run in fp32: the bf16 and fp16 blocks removed."""
    c = copy.deepcopy(config)
    for key in ("bf16", "bfloat16", "fp16"):
        c.pop(key, None)
    return c


def quiet(config):
    """Timers off and printing rare, for every contestant alike: a benchmark times the steps, not the logs."""
    c = copy.deepcopy(config)
    c["wall_clock_breakdown"] = False
    c["steps_per_print"] = 10**6
    return c


def _resolve_auto(node, path, resolve):
    if isinstance(node, dict):
        return {k: _resolve_auto(v, f"{path}.{k}" if path else k, resolve) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_auto(v, f"{path}[{i}]", resolve) for i, v in enumerate(node)]
    if node == "auto":
        return resolve(path)
    return node


def deepspeed_config(config, world, total_steps):
    """The config as deepspeed.initialize takes it: the zero3 block dropped, every "auto" given a value.

    DeepSpeed leaves "auto" to the Hugging Face integration, so a config that zero3 accepts would fail there;
    the values are the ones zero3 (and the HF Trainer) compute.
    """
    m = model_settings(config)
    train, micro, gas = resolve_batch(config, world)
    opt = optimizer_params(config)
    h = m["hidden"]
    values = {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": gradient_clipping(config),
        "optimizer.params.lr": opt["lr"],
        "optimizer.params.betas": list(opt["betas"]),
        "optimizer.params.eps": opt["eps"],
        "optimizer.params.weight_decay": opt["weight_decay"],
        "scheduler.params.total_num_steps": total_steps,
        "scheduler.params.warmup_max_lr": opt["lr"],
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_num_steps": max(1, total_steps // 10),
        "zero_optimization.reduce_bucket_size": h * h,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * h * h),
        "zero_optimization.prefetch_bucket_size": int(0.9 * h * h),
        "zero_optimization.stage3_param_persistence_threshold": 10 * h,
        "zero_optimization.param_persistence_threshold": 10 * h,
    }

    def resolve(path):
        if path not in values:
            raise ValueError(f"{path}: \"auto\" has no value the benchmark knows how to give DeepSpeed")
        return values[path]

    c = {k: v for k, v in config.items() if k != "zero3"}
    c = _resolve_auto(c, "", resolve)
    c["train_batch_size"] = train
    c["train_micro_batch_size_per_gpu"] = micro
    c["gradient_accumulation_steps"] = gas
    sched = c.get("scheduler", {}).get("params", {})
    if "total_num_steps" in sched:
        sched["total_num_steps"] = max(int(sched["total_num_steps"]), total_steps)
    return c


def describe(m):
    return (f"GPT {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, vocab {m['vocab_size']}, "
            f"context {m['seq_len']}, mlp_ratio {m['mlp_ratio']}: {gpt_param_count(m):,} params")


if __name__ == "__main__":
    import sys

    cfg = load_config(sys.argv[1] if len(sys.argv) > 1 else "configs/gpt-small.json")
    print(describe(model_settings(cfg)))
    print(f"batch at 2 ranks (train, micro, accumulation): {resolve_batch(cfg, 2)}")
    print(json.dumps(deepspeed_config(quiet(cfg), 2, 16), indent=1))
