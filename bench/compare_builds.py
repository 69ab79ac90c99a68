#!/usr/bin/env python3
"""Two builds of tessera on the same benchmarks, interleaved: is a refactor free?

    bench/compare_builds.py OLD_BIN_DIR NEW_BIN_DIR [--rounds 3] [--quick]

Each round runs, for both builds in alternating order (old first in odd rounds),
`bench_train --preset tiny`, `bench_train --preset small` and `bench_ops`, and reads
the JSON last line of each. It prints, per figure, the median of each build and the
ratio new/old, whether the training losses are bitwise the same, and one JSON line.
Figures are throughputs (higher is better); a ratio of 1.00 +- the round-to-round
spread of each build is noise.
"""
import argparse
import json
import statistics
import subprocess
import sys

RUNS = {
    "train_tiny": ["bench_train", "--preset", "tiny", "--steps", "12", "--warmup", "3"],
    "train_small": ["bench_train", "--preset", "small", "--steps", "6", "--warmup", "2"],
    "ops": ["bench_ops"],
}


def run(bin_dir, argv, quick):
    argv = [f"{bin_dir}/{argv[0]}"] + argv[1:]
    if quick and argv[0].endswith("bench_ops"):
        argv.append("--quick")
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def figures(name, result):
    """The throughput figures of one benchmark's JSON (name -> value)."""
    if name.startswith("train"):
        return {f"{name}.tokens_per_s": result["tokens_per_s"]}
    return {f"ops.{r['name']} ({r['unit']})": r["value"] for r in result["results"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="bench_ops --quick")
    args = parser.parse_args()
    samples = {"old": {}, "new": {}}
    losses = {"old": {}, "new": {}}
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for name, argv in RUNS.items():
            for build in order:
                result = run(getattr(args, build), argv, args.quick)
                for key, value in figures(name, result).items():
                    samples[build].setdefault(key, []).append(value)
                if "losses" in result:
                    losses[build].setdefault(name, []).append(result["losses"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    same_losses = all(
        all(l == losses["old"][name][0] for l in losses["old"][name] + losses["new"][name]) for name in losses["old"]
    )
    print(f"| figure | old (median of {args.rounds}) | old min..max | new | new min..max | new/old |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios = {}
    for key in samples["old"]:
        if key not in samples["new"]:
            continue
        old, new = statistics.median(samples["old"][key]), statistics.median(samples["new"][key])
        ratios[key] = new / old if old else float("nan")
        o, n = samples["old"][key], samples["new"][key]
        print(f"| {key} | {old:.4g} | {min(o):.4g}..{max(o):.4g} | {new:.4g} | {min(n):.4g}..{max(n):.4g} | {ratios[key]:.3f} |")
    print(f"training losses bitwise the same in every run: {'yes' if same_losses else 'NO'}")
    print(
        json.dumps(
            {
                "bench": "compare_builds",
                "rounds": args.rounds,
                "ratios": {k: round(v, 4) for k, v in ratios.items()},
                "ratio_min": round(min(ratios.values()), 4),
                "ratio_median": round(statistics.median(ratios.values()), 4),
                "losses_identical": same_losses,
            }
        )
    )


if __name__ == "__main__":
    main()
