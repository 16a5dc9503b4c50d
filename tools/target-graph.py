#!/usr/bin/env python3
"""docs/design.md's graph of the build's targets against the one CMake writes (cmake/Zero3TargetGraph.cmake).

  tools/target-graph.py check BUILD_DIR   exit 1, with the differing lines, when docs/design.md is stale
  tools/target-graph.py write BUILD_DIR   copy BUILD_DIR/zero3-targets.mmd into docs/design.md

The figure is drawn from a build with nvcc (preset default), which has every target; the test
unit.design_targets runs the check in such builds.
"""
import pathlib
import sys

BEGIN = "<!-- targets:begin (tools/target-graph.py write BUILD_DIR) -->"
END = "<!-- targets:end -->"
root = pathlib.Path(__file__).resolve().parent.parent
doc_path = root / "docs" / "design.md"


def split(doc):
    start = doc.index(BEGIN) + len(BEGIN)
    end = doc.index(END)
    return doc[:start], doc[start:end], doc[end:]


def block(graph):
    return "\n```mermaid\n" + graph.rstrip("\n") + "\n```\n"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write"):
        sys.exit(__doc__)
    graph = (pathlib.Path(sys.argv[2]) / "zero3-targets.mmd").read_text()
    doc = doc_path.read_text()
    head, current, tail = split(doc)
    if sys.argv[1] == "write":
        doc_path.write_text(head + block(graph) + tail)
        return
    if current == block(graph):
        print(f"target graph: docs/design.md draws the build's {graph.count(chr(10)) - 1} targets and links")
        return
    have = set(current.splitlines())
    want = set(block(graph).splitlines())
    for line in sorted(want - have):
        print(f"missing from docs/design.md: {line.strip()}")
    for line in sorted(have - want):
        print(f"in docs/design.md, not in the build: {line.strip()}")
    print("docs/design.md's target graph is stale: run tools/target-graph.py write BUILD_DIR on a build with nvcc")
    sys.exit(1)


main()
