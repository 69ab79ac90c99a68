#!/usr/bin/env python3
"""TensorBoard's own reader as the oracle for tessera's event files (train/tensorboard.h).

Loads event files with tensorboard.backend.event_processing.event_accumulator.EventAccumulator
(the reader behind TensorBoard's scalar dashboard; its record reader checks every
TFRecord's masked CRC32C) and writes the scalars as JSON:

  {"generator": ..., "versions": {"tensorboard": "2.21.0"}, "file_version": "brain.Event:2",
   "scalars": [{"tag": "train/loss", "step": 1, "value": 5.54, "wall_time": 1700000000.25}, ...]}

sorted by tag, then step (values are the float32 simple_values, as doubles).

Golden mode (run_oracle.sh):  tensorboard_events.py OUT.json
    reads the committed fixture tests/train/fixtures/tensorboard/ (written by
    tessera's TensorBoardWriter with a fixed clock; tests/train/test_tensorboard.cpp
    checks that the writer still produces it byte for byte) and writes
    goldens/tensorboard_events.json, which the same test compares with the scalars it wrote.
Live mode (the C++ trainer test, when .venv-oracles has tensorboard):
    tensorboard_events.py --events PATH OUT.json    (PATH: an event file or a directory)

Run through tests/oracles/run_oracle.sh tensorboard_events (pinned venv, live diff).
"""
import json
import os
import sys

import tensorboard
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

GENERATOR = "tests/oracles/tensorboard_events.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "train", "fixtures", "tensorboard")


def read_scalars(path):
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = []
    for tag in sorted(acc.Tags()["scalars"]):
        for e in acc.Scalars(tag):
            scalars.append({"tag": tag, "step": int(e.step), "value": float(e.value), "wall_time": float(e.wall_time)})
    scalars.sort(key=lambda s: (s["tag"], s["step"]))
    # The accumulator keeps only the version number (2.0): the string comes from each
    # file's first event, read with TensorBoard's raw event loader.
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)
    versions = sorted({next(iter(event_file_loader.EventFileLoader(f).Load())).file_version for f in files})
    return {
        "generator": GENERATOR,
        "versions": {"tensorboard": tensorboard.__version__},
        "file_version": versions[0] if len(versions) == 1 else versions,
        "files": len(files),
        "scalars": scalars,
    }


def main(argv):
    if len(argv) == 4 and argv[1] == "--events":
        path, out = argv[2], argv[3]
    elif len(argv) == 2 and not argv[1].startswith("-"):
        path, out = FIXTURE, argv[1]
    else:
        print(f"usage: {argv[0]} OUT.json | --events PATH OUT.json", file=sys.stderr)
        return 2
    if not os.path.exists(path):
        print(f"{argv[0]}: '{path}' does not exist", file=sys.stderr)
        return 2
    result = read_scalars(path)
    if not result["scalars"]:
        print(f"{argv[0]}: TensorBoard found no scalars in '{path}'", file=sys.stderr)
        return 1
    if len(argv) == 2:
        result["source"] = "tests/train/fixtures/tensorboard"
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
