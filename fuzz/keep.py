#!/usr/bin/env python3
"""Keeps the N inputs of a corpus that cover the most features (greedy set cover over a
libFuzzer merge control file), so the committed corpus stays a few hundred files.
  TARGET/-merge=1 -use_counters=0 -merge_control_file=CTL EMPTY_DIR CORPUS
  fuzz/keep.py CTL 400   # prints the coverage kept; deletes the other files"""
import os, sys

ctl, n = sys.argv[1], int(sys.argv[2])
lines = open(ctl).read().split("\n")
count = int(lines[0])
files = lines[2 : 2 + count]
features = {}
for line in lines[2 + count :]:
    parts = line.split()
    if parts and parts[0] == "FT":
        features[int(parts[1])] = set(map(int, parts[2:]))
every = set().union(*features.values())
covered, chosen = set(), []
while features and len(chosen) < n:
    best = max(features, key=lambda k: (len(features[k] - covered), -os.path.getsize(files[k])))
    if not features[best] - covered:
        break
    covered |= features.pop(best)
    chosen.append(best)
for i, f in enumerate(files):
    if i not in chosen:
        os.remove(f)
print(f"kept {len(chosen)} of {count} inputs: {len(covered)} of {len(every)} features "
      f"({100 * len(covered) / len(every):.1f}%)")
