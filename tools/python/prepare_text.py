#!/usr/bin/env python3
"""Turn text files into a zero3 token file (docs/data.md), byte-level or with a local tokenizer.json.

  tools/python/prepare_text.py --out corpus.tok --python-stdlib --glob '*.py'
  tools/python/prepare_text.py --out corpus.tok --tokenizer ./tokenizer.json notes/*.txt
  tools/python/prepare_text.py --out corpus.tok --baselines --heldout-fraction 0.05 --python-stdlib --glob '*.py'

Byte-level (the default) needs nothing beyond Python: each byte is a token, vocab_size 256. With
--tokenizer, the Hugging Face `tokenizers` package encodes the text with that file; nothing is ever
downloaded. Files are read in sorted path order, so the same inputs always give the same file; with
--separator ID that id is put between documents.

--baselines prints what `xz -9` and `gzip -9` achieve on the held-out bytes of a byte-level file (the last
floor(heldout_fraction x count) tokens, the split `zero3 train` holds out with the same
zero3.data.heldout_fraction; with --baseline-bytes N its first N bytes, those the model is evaluated on), in
bits per byte: a yardstick for the held-out loss in bits per byte (nats / ln 2 for byte-level tokens).

Exit status 1 with a message naming the file on bad input.
"""

import argparse
import fnmatch
import math
import os
import struct
import subprocess
import sys
import sysconfig

MAGIC = b"ZERO3TOK"
SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
VERSION = 1


def input_files(paths, pattern):
    """Every file named, and every file under each directory named (matching --glob), in sorted order."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                # Installed packages are not the library itself (and change with every pip install).
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
                for name in sorted(names):
                    if fnmatch.fnmatch(name, pattern):
                        found.append(os.path.join(root, name))
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise SystemExit(f"prepare_text: '{path}': no such file or directory")
    if not found:
        raise SystemExit(f"prepare_text: no input files matched {pattern!r} under {', '.join(paths)}")
    return sorted(set(found))


def byte_tokens(files, separator):
    out = bytearray()
    for i, path in enumerate(files):
        if i and separator is not None:
            out.append(separator)
        with open(path, "rb") as f:
            out += f.read()
    return out


def tokenizer_tokens(files, tokenizer_path, separator):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("prepare_text: --tokenizer needs the 'tokenizers' package (pip install tokenizers)")
    if not os.path.isfile(tokenizer_path):
        raise SystemExit(f"prepare_text: '{tokenizer_path}': no such tokenizer file")
    tok = Tokenizer.from_file(tokenizer_path)
    ids = []
    for i, path in enumerate(files):
        if i and separator is not None:
            ids.append(separator)
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            ids.extend(tok.encode(f.read(), add_special_tokens=False).ids)
    return ids, tok.get_vocab_size(with_added_tokens=True)


def write_token_file(path, ids, vocab_size):
    """zero3's layout: 32-byte header, then little-endian ids; written beside `path` and renamed over it."""
    width = 2 if vocab_size <= 1 << 16 else 4
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<IIQQ", VERSION, width, vocab_size, len(ids)))
            if isinstance(ids, (bytes, bytearray)):
                f.write(_widen(ids))  # byte-level: vocab 256, two bytes per token
            else:
                code = "H" if width == 2 else "I"
                for start in range(0, len(ids), 1 << 20):
                    chunk = ids[start : start + (1 << 20)]
                    f.write(struct.pack(f"<{len(chunk)}{code}", *chunk))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise SystemExit(f"prepare_text: writing '{path}': {e.strerror}")
    return width


def _widen(data):
    """Bytes as little-endian uint16 ids: each byte followed by a zero byte."""
    out = bytearray(2 * len(data))
    out[0::2] = data
    return bytes(out)


def baselines(heldout):
    """Bits per byte of the held-out bytes as `xz -9` and `gzip -9` store them (the programs themselves)."""
    data = bytes(heldout)
    sizes = {}
    for name, argv in (("xz -9", ["xz", "-9", "-c"]), ("gzip -9", ["gzip", "-9", "-n", "-c"])):
        try:
            sizes[name] = len(subprocess.run(argv, input=data, stdout=subprocess.PIPE, check=True).stdout)
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"prepare_text: --baselines: {argv[0]} failed: {e}")
    return {name: 8.0 * size / len(data) for name, size in sizes.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="text files, or directories searched recursively")
    ap.add_argument("--python-stdlib", action="store_true",
                    help="also read the standard library of the Python running this (sysconfig's 'stdlib')")
    ap.add_argument("--out", required=True, help="the token file to write")
    ap.add_argument("--glob", default="*", help="file-name pattern inside directories (default: every file)")
    ap.add_argument("--tokenizer", help="a local Hugging Face tokenizer.json (default: byte-level, vocab 256)")
    ap.add_argument("--separator", type=int, help="token id put between documents (default: none)")
    ap.add_argument("--max-bytes", type=int, help="stop adding files once this many input bytes are read")
    ap.add_argument("--heldout-fraction", type=float, default=0.1, help="as zero3.data.heldout_fraction")
    ap.add_argument("--baselines", action="store_true", help="print xz -9 and gzip -9 bits per held-out byte")
    ap.add_argument("--baseline-bytes", type=int,
                    help="compress only the held-out split's first N bytes: those the model is evaluated on, "
                         "heldout_samples x seq_len + 1 (default: the whole split)")
    args = ap.parse_args()

    inputs = list(args.inputs)
    if args.python_stdlib:
        inputs.append(sysconfig.get_paths()["stdlib"])
    if not inputs:
        raise SystemExit("prepare_text: name the input files or directories, or --python-stdlib")
    files = input_files(inputs, args.glob)
    if args.max_bytes is not None:
        kept, total = [], 0
        for path in files:
            if total >= args.max_bytes:
                break
            kept.append(path)
            total += os.path.getsize(path)
        files = kept
    if args.tokenizer:
        ids, vocab = tokenizer_tokens(files, args.tokenizer, args.separator)
    else:
        if args.separator is not None and not 0 <= args.separator < 256:
            raise SystemExit(f"prepare_text: --separator {args.separator} is not a byte (0 to 255)")
        ids, vocab = byte_tokens(files, args.separator), 256
    if not ids:
        raise SystemExit("prepare_text: the inputs hold no text")
    if args.separator is not None and not 0 <= args.separator < vocab:
        raise SystemExit(f"prepare_text: --separator {args.separator} outside the vocabulary [0, {vocab})")
    width = write_token_file(args.out, ids, vocab)
    heldout = math.floor(args.heldout_fraction * len(ids))
    print(f"prepare_text: {args.out}: {len(files)} files, {len(ids)} tokens x {width} bytes, vocab_size {vocab}, "
          f"{len(ids) - heldout} train / {heldout} held-out at heldout_fraction {args.heldout_fraction}")
    if args.baselines:
        if args.tokenizer:
            raise SystemExit("prepare_text: --baselines compares bytes: use it with byte-level files")
        if heldout == 0:
            raise SystemExit("prepare_text: --baselines: the held-out split is empty")
        tail = ids[len(ids) - heldout :]
        if args.baseline_bytes is not None:
            tail = tail[: args.baseline_bytes]
        for name, bpb in baselines(tail).items():
            print(f"held-out {name:8s} {bpb:.4f} bits/byte over {len(tail)} bytes")


if __name__ == "__main__":
    sys.exit(main())
