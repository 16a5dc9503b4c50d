#!/usr/bin/env python3
"""Layer rules the compiler cannot see, checked over the tracked files (tools/lint.sh runs it).

1. A target's include path holds only its own folder (or one below it) and outside packages: no
   target_include_directories names another folder of this repository (${PROJECT_SOURCE_DIR}/...,
   ${CMAKE_SOURCE_DIR}/..., or a path with ..). A folder that shares private headers does it through a target
   of its own (zero3_cuda_common, zero3_kernels_math, zero3_comm_health, zero3_models_internals), which others link.
2. No source outside runtime/include/zero3/core/env.hpp spells a ZERO3_* environment variable's name as a
   string of its own ("ZERO3_...") or passes one to getenv: every variable is declared once there.
"""
import re
import subprocess
import sys

tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], check=True, capture_output=True, text=True).stdout.splitlines()
problems = []

cmake_files = [f for f in tracked if f.endswith("CMakeLists.txt") or f.endswith(".cmake")]
call = re.compile(r"target_include_directories\s*\(([^)]*)\)", re.S)
for path in cmake_files:
    text = open(path, encoding="utf-8").read()
    for m in call.finditer(text):
        args = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        for bad in ("${PROJECT_SOURCE_DIR}", "${CMAKE_SOURCE_DIR}", "${zero3_SOURCE_DIR}", "/../", " ../"):
            if bad in args:
                problems.append(f"{path}:{line}: target_include_directories reaches outside its folder ({bad.strip()}): "
                                "link the target that owns those headers instead")

env_header = "runtime/include/zero3/core/env.hpp"
sources = [f for f in tracked if re.search(r"\.(cpp|hpp|cu|cuh)$", f) and not f.startswith("tests/")]
literal = re.compile(r'"ZERO3_[A-Z0-9_]+"|getenv\(\s*"ZERO3_')
for path in sources:
    if path == env_header:
        continue
    for n, text in enumerate(open(path, encoding="utf-8"), 1):
        if literal.search(text):
            problems.append(f"{path}:{n}: a ZERO3_* environment variable named outside {env_header}: "
                            "declare it there and read it with zero3::env::get")

for p in problems:
    print(p)
if problems:
    print(f"check-layers: {len(problems)} problem(s)")
    sys.exit(1)
print(f"check-layers: include paths of {len(cmake_files)} CMake files stay in their folders; "
      f"environment variables declared once ({len(sources)} sources)")
