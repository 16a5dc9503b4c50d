#!/usr/bin/env python3
"""Checks zero3's hjson syntax tests against hjson-py, the reader DeepSpeed uses for config files.

tests/unit/test_config_syntax.cpp holds each case as an input R"hj(...)hj" followed by the value zero3 must
give: R"js(...)js" (what hjson 3.1.0 gives, compared exactly, int and float kept apart), R"jsonrule(...)jsonrule"
(valid JSON on which hjson's value differs from JSON's, e.g. 1.0 read as 1; compared as numbers) or nullptr
(hjson rejects the text too). The test itself checks that zero3 reads each input to that value; this script
checks that the values written there are hjson's, so together they compare zero3 with hjson.

Usage (with a Python that has hjson 3.1.0, e.g. a venv outside the repository):
  python tools/python/ds_compat/hjson_diff.py [tests/unit/test_config_syntax.cpp]   # check every case
  python tools/python/ds_compat/hjson_diff.py --show FILE...                        # print hjson's reading of files
Inputs are read as DeepSpeed reads a config path: hjson.load(open(path), object_pairs_hook=<no duplicates>).
"""
import codecs
import io
import json
import re
import sys

import hjson

# An input (a raw string R"hj(...)hj" or a plain "..." literal) followed by its expected value.
CASE = re.compile(r'(?:R"hj\((.*?)\)hj"|"((?:[^"\\\n]|\\.)*)")\s*,\s*(?:R"(js|jsonrule)\((.*?)\)\3"|(nullptr))', re.S)


def no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate key %r" % k)
        d[k] = v
    return d


def read_like_deepspeed(text):
    # open(path, "r") reads in text mode: "\r\n" and "\r" become "\n".
    stream = io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8", newline=None)
    return hjson.load(stream, object_pairs_hook=no_duplicates)


def exact(v):
    """A form in which 1 and 1.0 differ and key order counts."""
    if isinstance(v, dict):
        return ("object", [(k, exact(x)) for k, x in v.items()])
    if isinstance(v, list):
        return ("array", [exact(x) for x in v])
    return (type(v).__name__, v)


def as_numbers(v):
    if isinstance(v, dict):
        return [(k, as_numbers(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [as_numbers(x) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return v


def check(test_file):
    source = open(test_file, encoding="utf-8").read()
    failures = 0
    cases = CASE.findall(source)
    for raw, literal, kind, expected, rejected in cases:
        # A plain literal's escapes (\\n, \\r, \\", \\xNN) are undone as C++ does: to bytes, read as UTF-8.
        text = raw if raw or not literal else codecs.escape_decode(literal.encode("utf-8"))[0].decode("utf-8")
        try:
            got = read_like_deepspeed(text)
            error = None
        except Exception as e:  # hjson raises HjsonDecodeError, and IndexError/OverflowError on some inputs
            got, error = None, "%s: %s" % (type(e).__name__, e)
        if rejected:
            ok = error is not None
        elif error is not None:
            ok = False
        elif kind == "js":
            ok = exact(got) == exact(json.loads(expected))
        else:
            ok = as_numbers(got) == as_numbers(json.loads(expected))
        if not ok:
            failures += 1
            print("MISMATCH %r\n  hjson: %s\n  test:  %s" % (text, error or json.dumps(got), expected or "rejected"))
    print("%d cases, %d mismatches" % (len(cases), failures))
    return 1 if failures or not cases else 0


def show(paths):
    for path in paths:
        text = open(path, encoding="utf-8", newline="").read()
        try:
            print("%s: %s" % (path, json.dumps(read_like_deepspeed(text))))
        except Exception as e:
            print("%s: rejected: %s: %s" % (path, type(e).__name__, e))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--show"]:
        sys.exit(show(args[1:]))
    sys.exit(check(args[0] if args else "tests/unit/test_config_syntax.cpp"))
