#!/usr/bin/env python3
"""DeepSpeed's own verdict on ds_config files: the reference the zero3 config corpus is checked against.

For each config file and world size, loads the file by path through DeepSpeed's
`deepspeed.runtime.config.DeepSpeedConfig` (hjson, as DeepSpeed reads paths), with the world size forced,
then runs the config-only checks DeepSpeed's engine makes at `deepspeed.initialize` that need no model:
the optimizer name, `max_grad_norm` in optimizer params, the params bound as keyword arguments of the
optimizer class the engine would build, the untested-optimizer-with-ZeRO rule, Lamb's dynamic loss scale,
`data_types.param_dtype` against fp16/bf16, `managed_gradient_accumulation`, and the scheduler built
from its params on a stand-in optimizer. For files with "auto", also the verdict after the Hugging Face
Trainer fills them in (HfTrainerDeepSpeedConfig with TrainingArguments that agree with the file's
explicit values, a stand-in hidden size and a run length), then the same checks.

Run with a Python that has deepspeed 0.19.8 (and transformers for the HF verdict), e.g. a virtual
environment outside the repository (pip install torch deepspeed==0.19.8 hjson transformers accelerate):
  DS_ACCELERATOR=cpu VENV/bin/python tools/python/ds_compat/ds_verdict.py tests/data/configs/corpus
  ... --manifest tests/data/configs/corpus/manifest.json --check     # exit 1 when a verdict changed
  ... --manifest tests/data/configs/corpus/manifest.json --update    # rewrite the "deepspeed" fields
  ... --json                                                       # the verdicts as JSON
"""

import argparse
import contextlib
import inspect
import io
import json
import logging
import os
import sys
import tempfile
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")
warnings.filterwarnings("ignore")

import hjson  # noqa: E402
import torch  # noqa: E402

WORLD_SIZES = (1, 2, 4, 8)
HIDDEN_SIZE = 1024  # stand-in model hidden size for the HF-filled "auto" bucket keys
MAX_STEPS = 100  # stand-in run length for the HF-filled scheduler step counts
MESSAGE_CHARS = 160  # verdict messages are cut here: enough to name the key, stable across runs


def _quiet_imports():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import deepspeed  # noqa: F401
        from deepspeed.runtime import config as ds_config
        from deepspeed.runtime import lr_schedules
    for name in ("DeepSpeed", "deepspeed", "transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ds_config, lr_schedules


DS_CONFIG, LR_SCHEDULES = _quiet_imports()


class ForcedWorld:
    """Makes DeepSpeedConfig see `size` ranks: it asks deepspeed.comm for rank and world size in __init__."""

    def __init__(self, size):
        self.size = size

    def __enter__(self):
        dist = DS_CONFIG.dist
        self.saved = (dist.get_world_size, dist.get_rank)
        dist.get_world_size = lambda *a, **k: self.size
        dist.get_rank = lambda *a, **k: 0
        return self

    def __exit__(self, *exc):
        DS_CONFIG.dist.get_world_size, DS_CONFIG.dist.get_rank = self.saved


def first_line(exc):
    if hasattr(exc, "errors") and callable(exc.errors):  # pydantic: name the field, not just the model
        try:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err.get("loc", ()))
            return f"{type(exc).__name__}: {exc.title}: {loc}: {err.get('msg', '')}"[:MESSAGE_CHARS]
        except Exception:  # noqa: BLE001 - fall back to the text
            pass
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}"
    return msg[:MESSAGE_CHARS]


def _optimizer_class(cfg):
    """The class DeepSpeed's engine (_configure_basic_optimizer) builds, and the kwargs it adds itself."""
    name = cfg.optimizer_name
    params = dict(cfg.optimizer_params or {})
    zero = cfg.zero_config
    device = zero.offload_optimizer.device if zero.offload_optimizer is not None else "none"
    cpu_opt = str(getattr(device, "value", device)) in ("cpu", "nvme")  # an enum or, with use_enum_values, a str
    if name in ("adam", "adamw"):
        adam_w_mode = params.pop("adam_w_mode", True)
        params.pop("fp32_optimizer_states", None)
        if params.pop("torch_adam", False):
            params.pop("foreach", None)
            return (torch.optim.AdamW if (name == "adamw" or adam_w_mode) else torch.optim.Adam), params
        if cpu_opt:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            return DeepSpeedCPUAdam, params
        from deepspeed.ops.adam import FusedAdam
        return FusedAdam, params
    if name == "adagrad":
        if cpu_opt:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
            return DeepSpeedCPUAdagrad, params
        return torch.optim.Adagrad, params
    if name == "lamb":
        from deepspeed.ops.lamb import FusedLamb
        return FusedLamb, params
    if name == "lion":
        if cpu_opt:
            from deepspeed.ops.lion import DeepSpeedCPULion
            return DeepSpeedCPULion, params
        from deepspeed.ops.lion import FusedLion
        return FusedLion, params
    if name in ("muon", "muadam", "muadamw", "musgd"):
        return None, params  # param groups built from the model (Muon) or a third-party package (mup)
    return getattr(torch.optim, name), params


def _zero_supported(cls):
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS
    return cls in ZERO_SUPPORTED_OPTIMIZERS


def _dummy_params():
    return [torch.nn.Parameter(torch.zeros(2))]


def engine_checks(cfg):
    """The engine's initialize-time checks that need only the config; raises what DeepSpeed raises."""
    name = cfg.optimizer_name
    if cfg.param_dtype is not None:
        model = torch.half if cfg.float16_config.enabled else (
            torch.bfloat16 if cfg.bfloat16_config.enabled else torch.float32)
        requested = DS_CONFIG.DtypeEnum(cfg.param_dtype).value
        assert requested == model, f"data_types.param_dtype='{cfg.param_dtype}' conflicts with the enabled precision mode"
    if name is not None:
        supported = name in DS_CONFIG.DEEPSPEED_OPTIMIZERS or getattr(torch.optim, name, None) is not None
        assert supported, f"{name} is not a supported DeepSpeed Optimizer"
        if name == "lamb":
            assert cfg.float16_config.loss_scale == 0, "DeepSpeed lamb optimizer requires dynamic loss scaling"
    if not cfg.managed_gradient_accumulation:
        assert cfg.zero_optimization_stage == 2 or not cfg.zero_config.overlap_comm, \
            "managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2"
    optimizer = None
    if name is not None:
        params = cfg.optimizer_params or {}
        if "max_grad_norm" in params:
            raise ValueError("'max_grad_norm' is not supported as an optimizer parameter")
        cls, kwargs = _optimizer_class(cfg)
        if cls is not None:
            if cls.__module__.startswith("torch."):
                optimizer = cls(_dummy_params(), **kwargs)  # cheap: torch validates the values too
            else:
                try:
                    inspect.signature(cls.__init__).bind(None, _dummy_params(), **kwargs)
                except TypeError as exc:
                    raise TypeError(f"{cls.__name__}.__init__() {exc}") from None
            if cfg.zero_enabled and not _zero_supported(cls):
                assert cfg.zero_allow_untested_optimizer, \
                    'You are using an untested ZeRO Optimizer. Please add <"zero_allow_untested_optimizer": true>'
    sched = cfg.scheduler_name
    if sched is not None:
        if hasattr(LR_SCHEDULES, sched):
            cls = getattr(LR_SCHEDULES, sched)
        else:
            assert hasattr(torch.optim.lr_scheduler, sched), f"DeepSpeed does not recognize LR scheduler {sched}"
            cls = getattr(torch.optim.lr_scheduler, sched)
        stand_in = optimizer if optimizer is not None else torch.optim.SGD(_dummy_params(), lr=0.001)
        with contextlib.redirect_stdout(io.StringIO()):
            cls(stand_in, **(cfg.scheduler_params or {}))


def deepspeed_verdict(source, world_size):
    """accept/reject for a path (DeepSpeed reads it with hjson) or a dict (already filled by HF)."""
    try:
        with ForcedWorld(world_size), contextlib.redirect_stdout(io.StringIO()):
            cfg = DS_CONFIG.DeepSpeedConfig(source)
        engine_checks(cfg)
    except Exception as exc:  # noqa: BLE001 - every failure is a verdict
        return {"verdict": "reject", "message": first_line(exc)}
    return {"verdict": "accept"}


def has_auto(node):
    if isinstance(node, dict):
        return any(has_auto(v) for v in node.values())
    if isinstance(node, list):
        return any(has_auto(v) for v in node)
    return node == "auto"


def _explicit(config, key):
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def hf_training_args(config, world_size, out_dir):
    """TrainingArguments that agree with the file's explicit batch values, as a user launching it would."""
    from transformers import TrainingArguments
    gas = _explicit(config, "gradient_accumulation_steps")
    micro = _explicit(config, "train_micro_batch_size_per_gpu")
    total = _explicit(config, "train_batch_size")
    if gas is None:
        gas = max(1, total // (micro * world_size)) if (micro and total) else 1
    if micro is None and total is not None:
        micro = max(1, total // (gas * world_size))
    kwargs = {"output_dir": out_dir, "max_steps": MAX_STEPS, "report_to": "none",
              "per_device_train_batch_size": micro or 8, "gradient_accumulation_steps": gas}
    opt = (config.get("optimizer") or {}).get("params") or {}
    if isinstance(opt.get("lr"), (int, float)):
        kwargs["learning_rate"] = opt["lr"]
    if isinstance(opt.get("weight_decay"), (int, float)):
        kwargs["weight_decay"] = opt["weight_decay"]
    if isinstance(opt.get("eps"), (int, float)):
        kwargs["adam_epsilon"] = opt["eps"]
    betas = opt.get("betas")
    if isinstance(betas, list) and len(betas) == 2 and all(isinstance(b, (int, float)) for b in betas):
        kwargs["adam_beta1"], kwargs["adam_beta2"] = betas
    if isinstance(config.get("gradient_clipping"), (int, float)):
        kwargs["max_grad_norm"] = config["gradient_clipping"]
    # fp16/bf16 as the file says; set on the wrapper, since TrainingArguments refuses them on a CPU-only host
    modes = {mode: (config.get(mode) or {}).get("enabled") is True for mode in ("fp16", "bf16")}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args = TrainingArguments(**kwargs)

    class WithWorld:  # TrainingArguments.world_size comes from the launcher; force it
        def __getattr__(self, name):
            return modes[name] if name in modes else getattr(args, name)

        world_size = property(lambda self: world_size)

    return WithWorld()


class StandInModel:
    class config:  # noqa: N801 - mimics model.config
        hidden_size = HIDDEN_SIZE


def hf_verdict(path, world_size):
    """The file as the HF Trainer hands it to DeepSpeed: json.load, "auto" filled, then DeepSpeed's verdict."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    try:
        hf = HfTrainerDeepSpeedConfig(path)  # strict json.load: hjson leniencies fail here
        with tempfile.TemporaryDirectory() as out:
            args = hf_training_args(hf.config, world_size, out)
            hf.trainer_config_process(args)
            hf.trainer_config_finalize(args, StandInModel(), MAX_STEPS)
    except Exception as exc:  # noqa: BLE001
        return {"verdict": "reject", "message": "HF: " + first_line(exc)}
    return deepspeed_verdict(hf.config, world_size)


def verdicts_for(path, world_sizes):
    try:
        with open(path, encoding="utf-8") as f:
            auto = has_auto(hjson.load(f))
    except Exception:  # noqa: BLE001 - DeepSpeed reports the syntax error itself
        auto = False
    out = {}
    for ws in world_sizes:
        entry = deepspeed_verdict(path, ws)
        if auto:
            entry["hf"] = hf_verdict(path, ws)
        out[str(ws)] = entry
    return out


def config_files(paths):
    for p in paths:
        if os.path.isdir(p):
            yield from sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".json") and f != "manifest.json")
        else:
            yield p


def cell(v):
    text = v["verdict"]
    if v["verdict"] == "reject":
        text += ": " + v["message"][:70]
    return text.replace("|", "\\|")


def print_table(results, world_sizes):
    print("| file | " + " | ".join(f"W={w}" for w in world_sizes) + " |")
    print("|---|" + "---|" * len(world_sizes))
    for name, per_ws in results.items():
        row = [cell(per_ws[str(w)]) + (f" (HF: {cell(per_ws[str(w)]['hf'])})" if "hf" in per_ws[str(w)] else "")
               for w in world_sizes]
        print(f"| {name} | " + " | ".join(row) + " |")


def check_manifest(manifest_path, world_sizes, update):
    """Re-derives every entry's DeepSpeed verdicts; reports (or, with update, writes) the differences."""
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    base = os.path.dirname(manifest_path)
    listed = {entry["file"] for entry in manifest["entries"]}
    unlisted = sorted(os.path.basename(p) for p in config_files([base]) if os.path.basename(p) not in listed)
    for name in unlisted:
        print(f"{name}: in the corpus folder but not in the manifest")
    differences = len(unlisted)
    for entry in manifest["entries"]:
        got = verdicts_for(os.path.join(base, entry["file"]), world_sizes)
        want = entry.get("deepspeed", {})
        for ws in map(str, world_sizes):
            if got.get(ws) != want.get(ws):
                differences += 1
                print(f"{entry['file']} W={ws}: manifest {json.dumps(want.get(ws))} != DeepSpeed {json.dumps(got[ws])}")
        if update:
            entry["deepspeed"] = got
    if update:
        with open(manifest_path, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
    print(f"{len(manifest['entries'])} entries, {differences} differences" + (" (written)" if update else ""))
    return 1 if differences and not update else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="config files or folders of them")
    ap.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)))
    ap.add_argument("--json", action="store_true", help="print {file: {world size: verdict}} as JSON")
    ap.add_argument("--manifest", help="corpus manifest.json")
    ap.add_argument("--check", action="store_true", help="re-derive the manifest's DeepSpeed verdicts, diff them")
    ap.add_argument("--update", action="store_true", help="with --manifest: write the re-derived verdicts into it")
    opts = ap.parse_args()
    world_sizes = [int(w) for w in opts.world_sizes.split(",")]
    if opts.check or opts.update:
        if not opts.manifest:
            ap.error("--check and --update need --manifest")
        return check_manifest(opts.manifest, world_sizes, opts.update)
    paths = opts.paths or ([os.path.dirname(opts.manifest)] if opts.manifest else [])
    if not paths:
        ap.error("give config files or folders")
    results = {os.path.basename(p): verdicts_for(p, world_sizes) for p in config_files(paths)}
    if opts.json:
        print(json.dumps(results, indent=1))
    else:
        print_table(results, world_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
