#!/usr/bin/env python3
"""Probe how DeepSpeed's config loader treats each config section.

For every section DeepSpeedConfig reads, this builds a small valid config, then
runs the loader three more times: with an unknown key injected into the section,
with a wrongly typed value for one known key, and with "auto" for that key. It
prints one markdown table row per section: what each variant gave (accepted,
with the value the loader kept, or the exception type and the first line of its
message). A second table probes pydantic's lax coercions on the strict models,
and a third the batch rule at world sizes 1, 2, 4 and 8.

Run it from a virtual environment OUTSIDE this repository that has deepspeed
installed (no GPU needed):

    DS_ACCELERATOR=cpu /path/to/venv/bin/python tools/python/ds_compat/probe_sections.py

The DeepSpeed version and pydantic version are printed first; the rows are what
that version does, so rerun it after upgrading DeepSpeed.
"""

import copy
import io
import logging
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed.comm as ds_comm  # noqa: E402
import pydantic  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

logging.getLogger("DeepSpeed").setLevel(logging.ERROR)

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
UNKNOWN = "zz_unknown_key"


def set_world(size):
    """DeepSpeedConfig asks deepspeed.comm for rank and world size; answer without a process group."""
    ds_comm.get_world_size = lambda *a, **k: size
    ds_comm.get_rank = lambda *a, **k: 0


def load(cfg):
    """Run the loader; return (config object or None, short outcome text)."""
    sink = io.StringIO()
    try:
        with redirect_stdout(sink), redirect_stderr(sink):
            ds = DeepSpeedConfig(copy.deepcopy(cfg))
        return ds, "ok"
    except Exception as e:  # the loader raises many types; report which
        return None, short_error(e)


def short_error(e):
    if isinstance(e, pydantic.ValidationError):
        errs = e.errors()
        first = errs[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"REJECT ValidationError [{first['type']}] {loc}: {first['msg']}"
    text = str(e).strip().splitlines()
    return f"REJECT {type(e).__name__}: {text[0][:110] if text else ''}"


def with_section(path, content):
    """BASE plus content placed at a dotted path ('' means top level)."""
    cfg = copy.deepcopy(BASE)
    if not path:
        cfg.update(content)
        return cfg
    node = cfg
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = content
    return cfg


def put(cfg, path, key, value):
    node = cfg
    for p in [p for p in path.split(".") if p]:
        node = node[p]
    node[key] = value
    return cfg


def outcome(cfg, getter):
    ds, text = load(cfg)
    if ds is None:
        return text
    try:
        return f"accepted -> {getter(ds)!r}"
    except Exception as e:
        return f"accepted (read-back failed: {type(e).__name__})"


# (section path, minimal valid content, key for the type/auto probes, wrong-typed value, getter of that key)
Z = {"stage": 3}
SECTIONS = [
    ("", {}, "gradient_clipping", "abc", lambda d: d.gradient_clipping),
    ("zero_optimization", dict(Z), "reduce_bucket_size", "abc", lambda d: d.zero_config.reduce_bucket_size),
    ("zero_optimization.offload_param", {"device": "cpu"}, "buffer_count", "abc",
     lambda d: d.zero_config.offload_param.buffer_count),
    ("zero_optimization.offload_optimizer", {"device": "cpu"}, "ratio", "abc",
     lambda d: d.zero_config.offload_optimizer.ratio),
    ("zero_optimization.zenflow", {}, "topk_ratio", "abc", lambda d: d.zero_config.zenflow.topk_ratio),
    ("zero_optimization.leaf_module", {}, "names", 5, lambda d: d.zero_config.leaf_module.names),
    ("fp16", {"enabled": True}, "initial_scale_power", "abc", lambda d: d.float16_config.initial_scale_power),
    ("bf16", {"enabled": True}, "immediate_grad_update", "abc", lambda d: d.bfloat16_config.immediate_grad_update),
    ("bfloat16", {"enabled": True}, "immediate_grad_update", "abc",
     lambda d: d.bfloat16_config.immediate_grad_update),
    ("torch_autocast", {"enabled": False}, "enabled", "abc", lambda d: d.torch_autocast_enabled),
    ("optimizer", {"type": "AdamW", "params": {"lr": 1e-3}}, "legacy_fusion", "abc",
     lambda d: d.optimizer_legacy_fusion),
    ("optimizer.params", {"lr": 1e-3}, "lr", "abc", lambda d: d.optimizer_params["lr"]),
    ("scheduler", {"type": "WarmupLR", "params": {}}, "type", 5, lambda d: d.scheduler_name),
    ("activation_checkpointing", {}, "number_checkpoints", "abc",
     lambda d: d.activation_checkpointing_config.number_checkpoints),
    ("comms_logger", {"enabled": False}, "verbose", "abc", lambda d: d.comms_config.comms_logger.verbose),
    ("tensorboard", {}, "job_name", 5, lambda d: d.monitor_config.tensorboard.job_name),
    ("wandb", {}, "project", 5, lambda d: d.monitor_config.wandb.project),
    ("csv_monitor", {}, "enabled", "abc", lambda d: d.monitor_config.csv_monitor.enabled),
    ("comet", {}, "samples_log_interval", "abc", lambda d: d.monitor_config.comet.samples_log_interval),
    ("flops_profiler", {}, "profile_step", "abc", lambda d: d.flops_profiler_config.profile_step),
    ("autotuning", {}, "results_dir", 5, lambda d: d.autotuning_config.results_dir),
    ("pipeline", {}, "stages", "abc", lambda d: d.pipeline["stages"]),
    ("data_efficiency", {}, "seed", "abc", lambda d: d.data_efficiency_config["seed"]),
    ("aio", {}, "block_size", "abc", lambda d: d.aio_config["block_size"]),
    ("checkpoint", {}, "tag_validation", 5, lambda d: d.checkpoint_tag_validation_enabled),
    ("checkpoint.writer", {}, "io_buffer_size", "abc", lambda d: d.checkpoint_config["writer"]["io_buffer_size"]),
    ("data_types", {}, "grad_accum_dtype", 5, lambda d: d.grad_accum_dtype),
    ("datastates_ckpt", {}, "enabled", "abc", lambda d: d.datastates_config.config),
    ("weight_quantization", {}, "num_bits", "abc", lambda d: d.weight_quantization_config.num_bits),
    ("hybrid_engine", {}, "max_out_tokens", "abc", lambda d: d.hybrid_engine.max_out_tokens),
    ("compile", {}, "free_activation_threshold", "abc", lambda d: d.compile_config.free_activation_threshold),
    ("timers", {}, "throughput", "abc", lambda d: d.timers_config.enabled),
    ("timers.throughput", {}, "enabled", "abc", lambda d: d.timers_config.enabled),
    ("tensor_parallel", {}, "autotp_size", "abc", lambda d: d.tensor_parallel_config.autotp_size),
    ("tensor_parallel.tp", {}, "tp_size", "abc", lambda d: d.tensor_parallel_config.tensor_parallel.tp_size),
    ("expert_parallel", {}, "autoep_size", "abc", lambda d: d.expert_parallel_config.autoep_size),
]

# Blocks the loader refuses by their mere presence (removed features).
PRESENCE_PROBES = [
    "amp", "nebula", "compression_training", "quantize_training", "sparse_gradients", "eigenvalue",
    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop"
]
ZERO_PRESENCE_PROBES = ["mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"]


def section_rows():
    rows = []
    for path, content, key, bad, getter in SECTIONS:
        base = with_section(path, copy.deepcopy(content))
        # A block that needs a parent ("zero_optimization.x") also gets stage 3 there.
        if path.startswith("zero_optimization."):
            base["zero_optimization"]["stage"] = 3
        if path.startswith("optimizer."):
            base["optimizer"]["type"] = "AdamW"
        _, valid = load(base)
        unknown = outcome(put(copy.deepcopy(base), path, UNKNOWN, 1), lambda d: "ignored")
        wrong = outcome(put(copy.deepcopy(base), path, key, bad), getter)
        auto = outcome(put(copy.deepcopy(base), path, key, "auto"), getter)
        rows.append((path or "(top level)", valid, unknown, f"{key}={bad!r}: {wrong}", auto))
    for name in PRESENCE_PROBES:
        rows.append((name, "-", "-", "-", "present ({}): " + load(with_section("", {name: {}}))[1]))
    for name in ZERO_PRESENCE_PROBES:
        rows.append(("zero_optimization." + name, "-", "-", "-",
                     "present: " + load(with_section("zero_optimization", {"stage": 3, name: 1}))[1]))
    return rows


# (section path, base content, key, getter) for the lax-coercion table
COERCE_FIELDS = [
    ("int", "zero_optimization", {"stage": 3}, "reduce_bucket_size", lambda d: d.zero_config.reduce_bucket_size),
    ("bool", "zero_optimization", {"stage": 3}, "contiguous_gradients",
     lambda d: d.zero_config.contiguous_gradients),
    ("float", "zero_optimization.offload_optimizer", {"device": "cpu"}, "ratio",
     lambda d: d.zero_config.offload_optimizer.ratio),
    ("enum stage", "zero_optimization", {}, "stage", lambda d: d.zero_config.stage),
    ("enum device", "zero_optimization.offload_param", {}, "device",
     lambda d: d.zero_config.offload_param.device),
    ("Optional[str]", "wandb", {}, "team", lambda d: d.monitor_config.wandb.team),
    ("str", "tensorboard", {}, "output_path", lambda d: d.monitor_config.tensorboard.output_path),
    ("List[str]", "zero_optimization.leaf_module", {}, "names", lambda d: d.zero_config.leaf_module.names),
]
COERCE_VALUES = [
    "500", " 500 ", "+500", "500.0", "1_000", "5e8", 500.0, 500.5, 1e9, True, False, 1, 0, 1.0, 0.0, 3, 3.0, "3",
    "true", "false", "True", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n", "1e-3", "0.5", "inf", None,
    [1], "cpu", "CPU",
]


def coercion_rows():
    """One row per probe value, one column per field kind; a cell is the kept value or 'X <error type>'."""
    rows = []
    for v in COERCE_VALUES:
        cells = []
        for kind, path, content, key, getter in COERCE_FIELDS:
            cfg = with_section(path, copy.deepcopy(content))
            if path.startswith("zero_optimization") and key != "stage":
                cfg["zero_optimization"]["stage"] = 3
            put(cfg, path, key, v)
            ds, text = load(cfg)
            if ds is None:
                cells.append("X " + text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text)
            else:
                cells.append(repr(getter(ds)))
        rows.append((repr(v), cells))
    return rows


def batch_rows():
    cases = [
        {"train_batch_size": 8},
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2},
        {"train_batch_size": 8, "gradient_accumulation_steps": 2},
        {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
        {"train_micro_batch_size_per_gpu": 2},
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2},
        {"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4},
        {"train_batch_size": 3},
        {"gradient_accumulation_steps": 2},
        {},
        {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2},
        {"train_batch_size": "8", "train_micro_batch_size_per_gpu": 2},
        {"train_batch_size": 8.0, "train_micro_batch_size_per_gpu": 2},
        {"train_batch_size": 0, "train_micro_batch_size_per_gpu": 2},
    ]
    rows = []
    for case in cases:
        cells = []
        for ws in (1, 2, 4, 8):
            set_world(ws)
            ds, text = load(case)
            cells.append(text if ds is None else f"{ds.train_batch_size}/{ds.train_micro_batch_size_per_gpu}/"
                         f"{ds.gradient_accumulation_steps}")
        rows.append((case, cells))
    set_world(1)
    return rows


Z3 = {"stage": 3}
# (what, config without the batch keys) for the loader's own cross-field checks and edge cases
CHECKS = [
    ("fp16 and bf16 both enabled", {"fp16": {"enabled": True}, "bf16": {"enabled": True}}),
    ("bf16 and bfloat16 both given (bf16 wins?)", {"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}),
    ("bf16: null falls back to bfloat16", {"bf16": None, "bfloat16": {"enabled": True}}),
    ("stage 4", {"zero_optimization": {"stage": 4}}),
    ("legacy zero_optimization: true", {"zero_optimization": True}),
    ("zero_optimization: null", {"zero_optimization": None}),
    ("fp16: null", {"fp16": None}),
    ("tensorboard: null", {"tensorboard": None}),
    ("alias and name both: stage3_prefetch_bucket_size + prefetch_bucket_size",
     {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 7, "prefetch_bucket_size": 9}}),
    ("deprecated cpu_offload: true", {"zero_optimization": {"stage": 3, "cpu_offload": True}}),
    ("cpu_offload with offload_optimizer", {"zero_optimization": {"stage": 3, "cpu_offload": True,
                                                                   "offload_optimizer": {"device": "cpu"}}}),
    ("stage3_gather_fp16_weights_on_model_save with the new name",
     {"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True,
                            "stage3_gather_16bit_weights_on_model_save": True}}),
    ("gradient_allreduce_op sum with stage 3", {"gradient_allreduce_op": "sum", "zero_optimization": Z3}),
    ("gradient_allreduce_op bogus", {"gradient_allreduce_op": "max"}),
    ("gradient_allreduce_op SUM (case)", {"gradient_allreduce_op": "SUM", "zero_optimization": {"stage": 2}}),
    ("communication_data_type bogus", {"communication_data_type": "int8"}),
    ("communication_data_type 5", {"communication_data_type": 5}),
    ("communication_data_type FP16 (case)", {"communication_data_type": "FP16"}),
    ("compute_grad_norm false with stage 3", {"zero_optimization": {"stage": 3, "compute_grad_norm": False}}),
    ("offload_optimizer.ratio 0.5 with stage 2",
     {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}),
    ("fp16_master_weights_and_grads with stage 0", {"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}),
    ("bf16_master_weights_and_grads with stage 0", {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}}),
    ("bf16_optimizer_states without master weights",
     {"bf16": {"enabled": True, "bf16_optimizer_states": True}, "zero_optimization": Z3}),
    ("fp16.loss_scale -1", {"fp16": {"enabled": True, "loss_scale": -1}}),
    ("fp16.loss_scale true", {"fp16": {"enabled": True, "loss_scale": True}}),
    ("fp16.loss_scale '128'", {"fp16": {"enabled": True, "loss_scale": "128"}}),
    ("fp16.loss_scale_window 0 (dynamic)", {"fp16": {"enabled": True, "loss_scale_window": 0}}),
    ("fp16.loss_scale_window 0 (static scale)", {"fp16": {"enabled": True, "loss_scale": 128, "loss_scale_window": 0}}),
    ("fp16.min_loss_scale true", {"fp16": {"enabled": True, "min_loss_scale": True}}),
    ("fp16.min_loss_scale 0.5 (dynamic)", {"fp16": {"enabled": True, "min_loss_scale": 0.5}}),
    ("zenflow select_strategy bogus", {"zero_optimization": {"stage": 2, "zenflow": {"select_strategy": "x"}}}),
    ("zenflow update_interval 0", {"zero_optimization": {"stage": 2, "zenflow": {"update_interval": 0}}}),
    ("zenflow with stage 3", {"zero_optimization": {"stage": 3, "zenflow": {}}}),
    ("reduce_bucket_size 0", {"zero_optimization": {"stage": 3, "reduce_bucket_size": 0}}),
    ("sub_group_size -1", {"zero_optimization": {"stage": 3, "sub_group_size": -1}}),
    ("checkpoint.tag_validation bogus", {"checkpoint": {"tag_validation": "x"}}),
    ("checkpoint.tag_validation fail (case)", {"checkpoint": {"tag_validation": "fail"}}),
    ("checkpoint.parallel_write.pipeline_stage 1", {"checkpoint": {"parallel_write": {"pipeline_stage": 1}}}),
    ("checkpoint.writer.type bogus", {"checkpoint": {"writer": {"type": "x"}}}),
    ("checkpoint.writer.data_parallel bogus", {"checkpoint": {"writer": {"data_parallel": "x"}}}),
    ("data_types.keep_in_fp32_modules 5", {"data_types": {"keep_in_fp32_modules": 5}}),
    ("torch_autocast.dtype bogus", {"torch_autocast": {"enabled": True, "dtype": "int4"}}),
    ("torch_autocast.lower_precision_safe_modules [1]", {"torch_autocast": {"lower_precision_safe_modules": [1]}}),
    ("autotuning.results_dir ''", {"autotuning": {"results_dir": ""}}),
    ("aio.use_gds true on cpu", {"aio": {"use_gds": True}}),
    ("curriculum enabled without metrics",
     {"data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": True}}}}),
    ("dynamic_batching enabled without max_tokens",
     {"data_efficiency": {"data_sampling": {"dynamic_batching": {"enabled": True}}}}),
    ("expert_parallel.load_balance_coeff 0.1", {"expert_parallel": {"load_balance_coeff": 0.1}}),
    ("tensor_parallel.vocab_parallel_ce_backend bogus", {"tensor_parallel": {"vocab_parallel_ce_backend": "x"}}),
    ("compile.passes bogus", {"compile": {"passes": ["x"]}}),
    ("compile.deepcompile with gradient_allreduce_op sum", {"compile": {"deepcompile": True},
                                                          "gradient_allreduce_op": "sum"}),
    ("optimizer.params.max_grad_norm 1.0 (warning only?)",
     {"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}}),
    ("optimizer without type", {"optimizer": {"params": {"lr": 1}}}),
    ("legacy_stage1 true", {"zero_optimization": {"stage": 1, "legacy_stage1": True}}),
    ("zero_optimization.stage 'auto'", {"zero_optimization": {"stage": "auto"}}),
    ("offload_param.nvme_path 5", {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                                                                        "nvme_path": 5}}}),
    ("hybrid_engine.max_out_tokens 0", {"hybrid_engine": {"max_out_tokens": 0}}),
]


def check_rows():
    rows = []
    for what, extra in CHECKS:
        cfg = copy.deepcopy(BASE)
        cfg.update(copy.deepcopy(extra))
        rows.append((what, load(cfg)[1]))
    return rows


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def main():
    print(f"DeepSpeed {deepspeed.__version__}, pydantic {pydantic.VERSION}, python {sys.version.split()[0]}\n")
    set_world(1)
    print("## Sections (world size 1)\n")
    print("| section | minimal config | unknown key | wrong type | \"auto\" for that key |")
    print("|---|---|---|---|---|")
    for r in section_rows():
        print("| " + " | ".join(cell(c) for c in r) + " |")
    print("\n## Lax coercions (X = ValidationError [type])\n")
    print("| value | " + " | ".join(cell(f"{f[1]}.{f[3]} ({f[0]})") for f in COERCE_FIELDS) + " |")
    print("|---|" + "---|" * len(COERCE_FIELDS))
    for value, cells in coercion_rows():
        print(f"| {cell(value)} | " + " | ".join(cell(c) for c in cells) + " |")
    print("\n## Cross-field checks and edge cases (world size 1)\n")
    print("| case | loader verdict |")
    print("|---|---|")
    for what, verdict in check_rows():
        print(f"| {cell(what)} | {cell(verdict)} |")
    print("\n## Batch rule (train_batch/micro/gas, by world size)\n")
    print("| config | ws=1 | ws=2 | ws=4 | ws=8 |")
    print("|---|---|---|---|---|")
    for case, cells in batch_rows():
        print(f"| {cell(case)} | " + " | ".join(cell(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
