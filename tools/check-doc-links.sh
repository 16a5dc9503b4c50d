#!/usr/bin/env bash
# Documentation references check: every Markdown link and every backticked repository path in
# docs/*.md, README.md and configs/README.md must name a file or folder of the repository.
#   Markdown links [text](target): resolved against the page's folder; http(s)/mailto links and pure
#     #anchors are skipped, a #anchor after a path is dropped.
#   Backticked paths: words inside `...` that start with runtime/, docs/, tools/, tests/, configs/,
#     kernels/, offload/ or cmake/ (fenced code blocks included), resolved against the repository root;
#     a :LINE suffix is dropped.
# A pair written a/b.{hpp,cpp} is checked as a/b.hpp and a/b.cpp. Skipped: globs (* ? [ ]), placeholders
# (<...>, ...), and paths under build/ (outputs).
# "In the repository" means tracked, or new and not ignored (git ls-files), so build outputs never count.
# Exit status 1 with one "FILE:LINE: missing PATH" line per broken reference.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os
import re
import subprocess
import sys

PREFIXES = ("runtime/", "docs/", "tools/", "tests/", "configs/", "kernels/", "offload/", "cmake/")

listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                        check=True, capture_output=True, text=True).stdout.splitlines()
files = {f for f in listed if os.path.exists(f)}  # a tracked file deleted in the work tree is gone
dirs = set()
for f in files:
    parts = f.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        dirs.add("/".join(parts[:i]))

pages = sorted(f for f in files if re.fullmatch(r"docs/[^/]+\.md", f)) + \
    [p for p in ("README.md", "configs/README.md") if p in files]


def exists(path):
    path = os.path.normpath(path)
    return path in files or path in dirs or path == "."


def expand(path):
    """a/b.{hpp,cpp} -> a/b.hpp, a/b.cpp (one brace group, as the pages write pairs of files)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not m:
        return [path]
    return [out for alt in m.group(1).split(",") for out in expand(path[:m.start()] + alt + path[m.end():])]


def skipped(path):
    return (re.search(r"[*?\[\]{}<>]", path) is not None or "..." in path or
            path == "build" or path.startswith("build/") or "/build/" in path)


link_re = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
code_re = re.compile(r"`([^`\n]+)`")
word_re = re.compile(r"(?:[^\s`'\"(),;={}]|\{[^{}\s]*\})+")  # commas only inside {a,b}

problems = []
for page in pages:
    base = os.path.dirname(page)
    fenced = False
    with open(page, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            refs = []
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                spans = [line]
            else:
                spans = code_re.findall(line)
                for target in link_re.findall(code_re.sub("", line)):
                    if re.match(r"(https?|mailto|ftp):", target) or target.startswith("#"):
                        continue
                    target = target.split("#", 1)[0]
                    if target and not skipped(target):
                        refs.append((target, os.path.join(base, target)))
            for span in spans:
                for word in word_re.findall(span):
                    if "..." in word:
                        continue  # a placeholder, before a sentence's full stop is taken off
                    word = word.rstrip(".:")
                    word = re.sub(r":\d+(-\d+)?$", "", word)
                    if word.startswith("./"):
                        word = word[2:]
                    for path in expand(word):
                        if path.startswith(PREFIXES) and not skipped(path):
                            refs.append((path, path))
            for shown, path in refs:
                if not exists(path):
                    problems.append(f"{page}:{lineno}: missing {shown}")

for p in problems:
    print(p)
if problems:
    print(f"check-doc-links: {len(problems)} broken reference(s) in {len(pages)} pages", file=sys.stderr)
    sys.exit(1)
print(f"check-doc-links: every reference resolves ({len(pages)} pages)")
PY
