#!/usr/bin/env python3
"""Writes tests/fuzz/config.dict, the libFuzzer dictionary of fuzz_config: every key of the key table
(kKeys in runtime/config/schema.cpp), the quoted values its type and default columns name, the enum
spellings of runtime/config/to_json.cpp, and JSON tokens and edge-case numbers. Rerun after the table
changes: python3 tests/fuzz/make_config_dict.py"""
import pathlib
import re

root = pathlib.Path(__file__).resolve().parents[2]
schema = (root / "runtime/config/schema.cpp").read_text()
table = schema[schema.index("constexpr KeySpec kKeys[]"):]
row = re.compile(r'\{k\w+,\s*"([^"]+)",\s*"((?:[^"\\]|\\.)*)",\s*"((?:[^"\\]|\\.)*)"')

keys, values = [], []
for m in row.finditer(table):
    keys.append(m.group(1))
    for column in (m.group(2), m.group(3)):
        values += re.findall(r'\\"([^"\\]+)\\"', column)
to_json = (root / "runtime/config/to_json.cpp").read_text()
values += [v for v in re.findall(r'return "([^"?]+)";', to_json)]
blocks = re.findall(r'constexpr std::string_view k\w+ = "([a-z_0-9.]+)";', schema)
keys += [part for b in blocks for part in b.split(".")]

def once(items):
    return list(dict.fromkeys(items))

tokens = ["{", "}", "[", "]", ":", ",", '""', "true", "false", "null", '"auto"', "0", "-1", "1.0", "1e-8",
          "0.5", "-0", "1e308", "1e309", "4294967296", "9223372036854775807", "18446744073709551616",
          "\\u0000", "\\ud800", '"zero3"', "//", "/*", "*/"]
lines = ["# libFuzzer dictionary for tests/fuzz/fuzz_config.cpp; written by tests/fuzz/make_config_dict.py"]
lines += [f'key_{i}="\\"{k}\\":"' for i, k in enumerate(once(keys))]
lines += [f'value_{i}="\\"{v}\\""' for i, v in enumerate(once(values))]
lines += ["token_{}=\"{}\"".format(i, t.replace("\\", "\\\\").replace('"', '\\"')) for i, t in enumerate(tokens)]
(root / "tests/fuzz/config.dict").write_text("\n".join(lines) + "\n")
