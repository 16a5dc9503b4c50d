#!/usr/bin/env python3
"""A Llama model in and out of the Hugging Face layout, end to end at world size 2 (fp32, host backend).

usage: hf_llama_test.py ZERO3 LLAMA_LOGITS MPIEXEC [MPIEXEC_FLAGS...]

The test writes a tiny Llama (grouped-query attention), a Qwen2-shaped one (q/k/v biases) and a Qwen2-shaped
one with tied embeddings (no lm_head.weight: the output layer is the embedding) the way transformers lays
them out (config.json and model.safetensors, the safetensors bytes assembled here from the format's
description) with random weights, and a token file, then checks:
  1. import: the host Llama's fp32 logits (tests/unit/llama_logits.cpp: zero3's config path and safetensors
     reader, no engine) equal a float64 numpy reference forward of the same weights (max |difference| within
     1e-5 of the largest logit), and `zero3 train` with init_from and hf_config at lr 0 reports a held-out loss
     equal to the reference's over the same held-out windows (within 1e-5 relative);
  2. export: `zero3 ckpt export --format hf` of that run gives back every tensor byte for byte and a
     config.json with the same shape; a small --max-shard-size gives shards and an index;
  3. after 4 training steps, the exported model's loss on the held-out windows, by the numpy reference and
     by transformers when installed (an optional cross-check; without it the run says so), equals zero3's
     final held-out loss within 1e-4;
  4. bad input: a tensor missing, one of the wrong shape and one the model lacks are errors naming the
     file and the tensor;
  5. ranged loading: initializing a ~100 MB model from its checkpoint raises each rank's peak resident
     memory, over the same job initialized at random, by less than half of the checkpoint's size (the least
     of three runs of each; DeepSpeed's ranks each load the whole file first).
Exit 77 (skipped, tests/support/skip.py) without numpy.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from skip import skip  # noqa: E402

try:
    import numpy as np
except ImportError:
    skip("hf_llama_test: numpy is not installed (tools/test.sh installs it)")

ZERO3, LLAMA_LOGITS, MPIEXEC = sys.argv[1], sys.argv[2], sys.argv[3:]
CONTEXT, HELDOUT_SAMPLES, HELDOUT_FRACTION = 16, 8, 0.25
failures = []


def fail(what):
    print("FAIL:", what)
    failures.append(what)


def hf_config(qwen2, tied=False):
    c = {"architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
         "model_type": "qwen2" if qwen2 else "llama", "vocab_size": 64, "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": tied, "torch_dtype": "float32"}
    if not qwen2:
        c["attention_bias"] = False
        c["mlp_bias"] = False
    return c


def random_weights(c, seed, qwen2, tied=False):
    rng = np.random.default_rng(seed)
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (v, d))}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, d)
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, d)
        for name, shape in [("self_attn.q_proj", (q, d)), ("self_attn.k_proj", (kv, d)), ("self_attn.v_proj", (kv, d)),
                            ("self_attn.o_proj", (d, q)), ("mlp.gate_proj", (f, d)), ("mlp.up_proj", (f, d)),
                            ("mlp.down_proj", (d, f))]:
            w[p + name + ".weight"] = rng.normal(0, 0.2, shape)
        if qwen2:
            for name, n in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)]:
                w[p + f"self_attn.{name}.bias"] = rng.normal(0, 0.1, n)
    w["model.norm.weight"] = 1 + rng.normal(0, 0.1, d)
    if not tied:  # a tied checkpoint stores the embedding once, as transformers saves it
        w["lm_head.weight"] = rng.normal(0, 0.2, (v, d))
    return {k: v.astype(np.float32) for k, v in w.items()}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        b = np.ascontiguousarray(t, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").reshape(e["shape"])
    return out


def read_hf_dir(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(path, "model.safetensors"))
    out = {}
    for file in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(read_safetensors(os.path.join(path, file)))
    return out


def write_tokens(path, ids, vocab):
    with open(path, "wb") as f:
        f.write(b"ZERO3TOK" + struct.pack("<IIQQ", 1, 2, vocab, len(ids)) + np.asarray(ids, "<u2").tobytes())


def heldout_windows(ids):
    heldout = math.floor(HELDOUT_FRACTION * len(ids))
    start = len(ids) - heldout
    return [ids[start + i * CONTEXT:start + i * CONTEXT + CONTEXT + 1] for i in range(HELDOUT_SAMPLES)]


def rmsnorm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(x, theta):  # x [len, heads, hd]; transformers' rotate-half pairing
    n, _, hd = x.shape
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference_logits(w, c, tokens):
    """Logits [len, vocab] in float64, written from the Llama paper and transformers' modeling_llama
    description (RMSNorm, rotary, GQA, SwiGLU), not from zero3's code."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    heads, kvh = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c["hidden_size"] // heads
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    n = len(tokens)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        proj = lambda name: h @ w[p + f"self_attn.{name}.weight"].T + w.get(p + f"self_attn.{name}.bias", 0.0)
        q = rope(proj("q_proj").reshape(n, heads, hd), theta)
        k = rope(proj("k_proj").reshape(n, kvh, hd), theta)
        v = proj("v_proj").reshape(n, kvh, hd)
        k, v = np.repeat(k, heads // kvh, axis=1), np.repeat(v, heads // kvh, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        scores = np.where(np.tril(np.ones((n, n), bool))[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", prob, v).reshape(n, heads * hd)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])  # tied: the embedding
    return rmsnorm(x, w["model.norm.weight"], eps) @ head.T


def reference_loss(w, c, windows):
    """Mean cross-entropy over every predicted token of the windows, from reference_logits."""
    total, count = 0.0, 0
    for win in windows:
        targets = np.asarray(win[1:])
        logits = reference_logits(w, c, win[:-1])
        n = len(targets)
        m = logits.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        total += float((lse - logits[np.arange(n), targets]).sum())
        count += n
    return total / count


def transformers_loss(path, windows):
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("hf_llama_test: no transformers cross-check (torch or transformers is not installed); the numpy "
              "reference checked the same loss")
        return None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # transformers >= 4.56
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for win in windows:
            ids = torch.tensor([win[:-1]])
            logits = model(ids).logits[0].double()
            total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(win[1:]), reduction="sum"))
            count += len(win) - 1
    return total / count


def train(tmp, name, config, steps, extra=()):
    job = os.path.join(tmp, name + ".json")
    json.dump(config, open(job, "w"))
    metrics = os.path.join(tmp, name + ".jsonl")
    cmd = MPIEXEC + ["-np", "2", ZERO3, "train", "--config", job, "--steps", str(steps), "--heldout-samples",
                     str(HELDOUT_SAMPLES), "--log-interval", str(steps), "--metrics", metrics, "--progress", "off",
                     "--save-dir", os.path.join(tmp, name + "_ckpt"), "--save-interval", str(steps),
                     "--run-dir", os.path.join(tmp, name + "_run"), *extra]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r, metrics


def job_config(model_dir, tokens, lr, steps):
    return {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 3},
            "zero3": {"device": "host",
                      "model": {"type": "llama", "hf_config": os.path.join(model_dir, "config.json"),
                                "seq_len": CONTEXT, "init_from": model_dir},
                      "data": {"source": "tokens:" + tokens, "heldout_fraction": HELDOUT_FRACTION},
                      "run": {"steps": steps}}}


def export(tmp, name, out, extra=()):
    r = subprocess.run([ZERO3, "ckpt", "export", os.path.join(tmp, name + "_ckpt"), "--format", "hf", "--out", out,
                        *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        fail(f"export of {name} exited {r.returncode}: {r.stdout[-800:]}")
    return r


def check_model(tmp, qwen2, tied=False):
    tag = ("qwen2" if qwen2 else "llama") + ("_tied" if tied else "")
    c = hf_config(qwen2, tied)
    model_dir = os.path.join(tmp, tag + "_hf")
    os.makedirs(model_dir)
    json.dump(c, open(os.path.join(model_dir, "config.json"), "w"))
    weights = random_weights(c, (3 if qwen2 else 1) + (4 if tied else 0), qwen2, tied)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), weights)
    ids = np.random.default_rng(7).integers(0, c["vocab_size"], 3000).tolist()
    tokens = os.path.join(tmp, tag + ".tok")
    write_tokens(tokens, ids, c["vocab_size"])
    windows = heldout_windows(ids)

    # 1. import: the model's logits, then zero3 train's held-out loss at lr 0, against the reference forward.
    logits_file = os.path.join(tmp, tag + "_logits.f32")
    r = subprocess.run([LLAMA_LOGITS, model_dir, ",".join(map(str, windows[0][:-1])), logits_file],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        return fail(f"{tag}: llama_logits exited {r.returncode}: {r.stdout[-800:]}")
    got = np.fromfile(logits_file, dtype="<f4").reshape(CONTEXT, c["vocab_size"]).astype(np.float64)
    ref = reference_logits(weights, c, windows[0][:-1])
    worst = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    print(f"{tag}: import: logits max |zero3 - reference| / max |reference| = {worst:.2e}")
    if worst > 1e-5:
        fail(f"{tag}: logits differ from the float64 reference by {worst:.2e} of the largest (> 1e-5)")
    r, metrics = train(tmp, tag + "_import", job_config(model_dir, tokens, 0.0, 1), 1)
    if r.returncode != 0:
        return fail(f"{tag}: import run exited {r.returncode}: {r.stdout[-1500:]}")
    zero3_loss = [json.loads(l) for l in open(metrics)][-1]["heldout_loss"]
    ref = reference_loss(weights, c, windows)
    rel = abs(zero3_loss - ref) / ref
    print(f"{tag}: import: zero3 held-out loss {zero3_loss:.8f}, float64 reference {ref:.8f}, rel {rel:.2e}")
    if rel > 1e-5:
        fail(f"{tag}: imported model's held-out loss {zero3_loss} vs reference {ref} (rel {rel:.2e} > 1e-5)")

    # 2. export: the same bytes back, the same shape in config.json; shards under a small limit.
    out = os.path.join(tmp, tag + "_export")
    export(tmp, tag + "_import", out)
    back = read_hf_dir(out)
    if set(back) != set(weights):
        fail(f"{tag}: exported names differ: {sorted(set(back) ^ set(weights))}")
    for name, t in weights.items():
        if name in back and back[name].tobytes() != t.tobytes():
            fail(f"{tag}: exported {name} differs from the imported tensor")
    exported = json.load(open(os.path.join(out, "config.json")))
    for key in ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings"]:
        if exported.get(key) != c[key]:
            fail(f"{tag}: config.json {key} = {exported.get(key)}, expected {c[key]}")
    sharded = os.path.join(tmp, tag + "_sharded")
    export(tmp, tag + "_import", sharded, ["--max-shard-size", "20KB"])
    index = os.path.join(sharded, "model.safetensors.index.json")
    if not os.path.exists(index) or len(set(json.load(open(index))["weight_map"].values())) < 2:
        fail(f"{tag}: --max-shard-size 20KB did not shard the export")
    elif any(read_hf_dir(sharded)[n].tobytes() != t.tobytes() for n, t in weights.items()):
        fail(f"{tag}: the sharded export differs")

    # 3. trained: the exported model's loss (numpy, transformers) equals zero3's final held-out loss.
    r, metrics = train(tmp, tag + "_trained", job_config(model_dir, tokens, 3e-3, 4), 4)
    if r.returncode != 0:
        return fail(f"{tag}: training run exited {r.returncode}: {r.stdout[-1500:]}")
    final = [json.loads(l) for l in open(metrics)][-1]["heldout_loss"]
    out = os.path.join(tmp, tag + "_trained_export")
    export(tmp, tag + "_trained", out)
    trained = read_hf_dir(out)
    if all(trained[n].tobytes() == t.tobytes() for n, t in weights.items()):
        fail(f"{tag}: 4 training steps changed no weight")
    ref = reference_loss(trained, c, windows)
    rel = abs(final - ref) / ref
    print(f"{tag}: trained: zero3 held-out loss {final:.8f}, reference on the export {ref:.8f}, rel {rel:.2e}")
    if rel > 1e-4:
        fail(f"{tag}: zero3's held-out loss {final} vs the exported model's {ref} (rel {rel:.2e} > 1e-4)")
    hf = transformers_loss(out, windows)
    if hf is not None:
        rel = abs(final - hf) / hf
        print(f"{tag}: trained: transformers' loss on the export {hf:.8f}, rel {rel:.2e}")
        if rel > 1e-4:
            fail(f"{tag}: transformers' loss {hf} vs zero3's held-out loss {final} (rel {rel:.2e} > 1e-4)")
    return model_dir, tokens


def check_bad_checkpoints(tmp, model_dir, tokens):
    weights = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    cases = {
        "missing": ({k: v for k, v in weights.items() if k != "model.norm.weight"}, "no tensor \"model.norm.weight\""),
        "shape": ({**weights, "model.norm.weight": np.ones(31, np.float32)}, "tensor \"model.norm.weight\" has shape [31]"),
        "extra": ({**weights, "model.extra.weight": np.ones(2, np.float32)}, "tensor \"model.extra.weight\" matches no param"),
    }
    for name, (tensors, expected) in cases.items():
        bad = os.path.join(tmp, "bad_" + name)
        os.makedirs(bad)
        write_safetensors(os.path.join(bad, "model.safetensors"), tensors)
        cfg = job_config(model_dir, tokens, 0.0, 1)
        cfg["zero3"]["model"]["init_from"] = bad
        r, _ = train(tmp, "bad_" + name, cfg, 1)
        if r.returncode == 0 or expected not in r.stdout or "model.safetensors" not in r.stdout:
            fail(f"bad checkpoint '{name}': exit {r.returncode}, expected an error with {expected!r}: {r.stdout[-600:]}")


# Runs one rank and writes its peak resident set (Python's getrusage over the child) to a file of its own,
# argv[1] + the rank, so that every rank's peak is known without a `time` program. A file and not stdout:
# mpirun interleaves the ranks' output ("maxrss_kbmaxrss_kb 697540" was seen under load).
RSS_WRAPPER = ("import os, resource, subprocess, sys; code = subprocess.run(sys.argv[2:]).returncode; "
               "open(sys.argv[1] + os.environ.get('OMPI_COMM_WORLD_RANK', '0'), 'w').write("
               "str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(code)")


def peak_rss_kb(tmp, name, config):
    job = os.path.join(tmp, name + ".json")
    json.dump(config, open(job, "w"))
    rss_prefix = os.path.join(tmp, name + ".maxrss_kb.rank")
    cmd = MPIEXEC + ["-np", "2", sys.executable, "-c", RSS_WRAPPER, rss_prefix, ZERO3, "train", "--config", job,
                     "--steps", "1", "--heldout-samples", "1", "--progress", "off", "--run-dir",
                     os.path.join(tmp, name + "_run")]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    files = [rss_prefix + str(rank) for rank in range(2)]
    if r.returncode != 0 or not all(os.path.exists(f) for f in files):
        fail(f"memory run {name} exited {r.returncode}: {r.stdout[-1500:]}")
        return None
    return max(int(open(f).read()) for f in files)


def check_ranged_loading(tmp):
    c = hf_config(False)
    c.update({"vocab_size": 8192, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 2,
              "num_attention_heads": 12, "num_key_value_heads": 4})
    model_dir = os.path.join(tmp, "big_hf")
    os.makedirs(model_dir)
    json.dump(c, open(os.path.join(model_dir, "config.json"), "w"))
    write_safetensors(os.path.join(model_dir, "model.safetensors"), random_weights(c, 5, False))
    size = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    tokens = os.path.join(tmp, "big.tok")
    write_tokens(tokens, np.random.default_rng(3).integers(0, c["vocab_size"], 2000).tolist(), c["vocab_size"])
    with_init_config = job_config(model_dir, tokens, 0.0, 1)
    random_config = job_config(model_dir, tokens, 0.0, 1)
    del random_config["zero3"]["model"]["init_from"]
    # A job's peak RSS moves by some 25 MiB from run to run on a loaded machine: three runs of each,
    # interleaved, and the least of each.
    with_init, without = [], []
    for i in range(3):
        with_init.append(peak_rss_kb(tmp, f"rss_init_from{i}", with_init_config))
        without.append(peak_rss_kb(tmp, f"rss_random{i}", random_config))
    if None in with_init or None in without:
        return
    extra = (min(with_init) - min(without)) * 1024
    print(f"ranged loading: checkpoint {size / 2**20:.1f} MiB; peak RSS per rank, least of 3 runs, "
          f"{min(with_init) / 1024:.1f} MiB with init_from, {min(without) / 1024:.1f} MiB initialized at random: "
          f"{extra / 2**20:+.1f} MiB for the import (runs: {[round(k / 1024, 1) for k in with_init]} and "
          f"{[round(k / 1024, 1) for k in without]} MiB)")
    if extra > size / 2:
        fail(f"init_from raised a rank's peak memory by {extra / 2**20:.1f} MiB, over half of the "
             f"{size / 2**20:.1f} MiB checkpoint")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        result = check_model(tmp, qwen2=False)
        check_model(tmp, qwen2=True)
        check_model(tmp, qwen2=True, tied=True)
        if result:
            check_bad_checkpoints(tmp, *result)
        check_ranged_loading(tmp)
    if failures:
        print(f"hf_llama_test: {len(failures)} failure(s)")
        return 1
    print("hf_llama_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
