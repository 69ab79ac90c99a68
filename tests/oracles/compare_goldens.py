#!/usr/bin/env python3
"""Compares two golden files: same structure, same strings and integers, floats
within |a - b| <= tol * max(1, |b|). Prints each difference (capped) and a summary;
exits 1 when they differ. Version strings are reported but never fail the check.

Usage: compare_goldens.py NEW.json COMMITTED.json [--tol 1e-12]
"""
import json
import sys


def walk(new, old, path, diffs):
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k not in new:
                diffs.append(f"{path}/{k}: missing from the regenerated golden")
            elif k not in old:
                diffs.append(f"{path}/{k}: new in the regenerated golden")
            else:
                walk(new[k], old[k], f"{path}/{k}", diffs)
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            diffs.append(f"{path}: length {len(new)} vs committed {len(old)}")
            return
        for i, (a, b) in enumerate(zip(new, old)):
            name = a.get("name") if isinstance(a, dict) and "name" in a else i
            walk(a, b, f"{path}[{name}]", diffs)
    elif isinstance(old, float) or isinstance(new, float):
        if not isinstance(new, (int, float)) or not isinstance(old, (int, float)):
            diffs.append(f"{path}: {new!r} vs committed {old!r}")
        elif abs(new - old) > TOL * max(1.0, abs(old)):
            diffs.append(f"{path}: {new!r} vs committed {old!r} (diff {new - old:.3g})")
    elif new != old:
        diffs.append(f"{path}: {new!r} vs committed {old!r}")


def main():
    global TOL
    args = sys.argv[1:]
    TOL = 1e-12
    if "--tol" in args:
        i = args.index("--tol")
        TOL = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    new, old = (json.load(open(p)) for p in args)
    if new.get("versions") != old.get("versions"):
        print(f"note: versions {new.get('versions')} vs committed {old.get('versions')}")
    new.pop("versions", None)
    old.pop("versions", None)
    diffs = []
    walk(new, old, "", diffs)
    for d in diffs[:40]:
        print("  " + d)
    if len(diffs) > 40:
        print(f"  ... and {len(diffs) - 40} more")
    n = len(old.get("cases", []))
    if diffs:
        print(f"DIFFERENT: {len(diffs)} differences (tol {TOL:g}) between {args[0]} and {args[1]}")
        return 1
    print(f"OK: {n} cases match the committed golden within {TOL:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
