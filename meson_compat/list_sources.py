#!/usr/bin/env python3
"""Prints the .cpp files under TOP/DIR (relative to meson_compat/), like CMake's globs."""
import os
import sys

top, sub = sys.argv[1], sys.argv[2]
exclude = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--exclude" else None
here = os.path.dirname(os.path.abspath(__file__))
out = []
for root, _, files in os.walk(os.path.join(top, sub)):
    rel_root = os.path.relpath(root, top)
    if exclude and (rel_root == exclude or rel_root.startswith(exclude + os.sep)):
        continue
    for f in files:
        if f.endswith(".cpp"):
            out.append(os.path.relpath(os.path.join(root, f), here))
print("\n".join(sorted(out)))
