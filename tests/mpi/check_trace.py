#!/usr/bin/env python3
"""Structural checks of a `zero3 train --profile` trace (Chrome trace-event JSON), standard library only:
every event has the fields its phase needs; spans (ph X) have a non-negative duration and, per track
(pid, tid), are disjoint or nested, never crossing; instants and counters carry timestamps; the expected
processes (one per rank), tracks, memory counters and step markers are present.
usage: check_trace.py TRACE.json RANKS STEPS TRACK [TRACK...]   exit 0 when every check holds."""
import json
import sys


def main():
    path, ranks, steps, tracks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    failures = []
    with open(path) as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        print(f"FAIL: {path}: no traceEvents array")
        return 1
    names = {}  # (pid, tid) -> track
    processes = {}
    spans = {}
    counters = {}
    steps_seen = {}
    for i, e in enumerate(events):
        ph = e.get("ph")
        for field in ("ph", "pid", "name"):
            if field not in e:
                failures.append(f"event {i} has no {field}: {e}")
        if ph == "M":
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            elif e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            continue
        if not isinstance(e.get("ts"), (int, float)) or e["ts"] < 0:
            failures.append(f"event {i} has no timestamp: {e}")
            continue
        if ph == "X":
            if "tid" not in e or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                failures.append(f"span {i} lacks tid or a duration >= 0: {e}")
                continue
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph == "C":
            if not isinstance(e.get("args"), dict) or not e["args"]:
                failures.append(f"counter {i} has no series: {e}")
            counters.setdefault(e["pid"], set()).add(e["name"])
        elif ph == "i":
            if e["name"].startswith("step "):
                steps_seen[e["pid"]] = steps_seen.get(e["pid"], 0) + 1
        else:
            failures.append(f"event {i}: unexpected phase {ph!r}")
    for key, list_ in spans.items():
        track = names.get(key)
        if track is None:
            failures.append(f"spans on pid {key[0]} tid {key[1]} without a thread_name")
        list_.sort(key=lambda s: (s[0], -s[1]))
        open_ = []  # ends of the enclosing spans
        for begin, end, name in list_:
            while open_ and open_[-1] <= begin:
                open_.pop()
            if open_ and end > open_[-1]:
                failures.append(f"track {track!r} of pid {key[0]}: span {name!r} [{begin}, {end}] crosses its parent")
                break
            open_.append(end)
    if sorted(processes) != list(range(ranks)):
        failures.append(f"processes {sorted(processes)} instead of ranks 0..{ranks - 1}")
    for pid in range(ranks):
        present = {names[k] for k in names if k[0] == pid}
        for t in tracks:
            if not any(p == t or p.startswith(t + " ") for p in present):
                failures.append(f"rank {pid}: no track {t!r} (has {sorted(present)})")
        if "memory device (MiB)" not in counters.get(pid, set()):
            failures.append(f"rank {pid}: no memory counter (has {sorted(counters.get(pid, set()))})")
        if steps_seen.get(pid, 0) != steps:
            failures.append(f"rank {pid}: {steps_seen.get(pid, 0)} step markers, expected {steps}")
    for f_ in failures[:20]:
        print("FAIL:", f_)
    if failures:
        return 1
    total = sum(len(v) for v in spans.values())
    print(f"trace ok: {len(events)} events, {total} spans on {len(spans)} tracks, {ranks} ranks, {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
