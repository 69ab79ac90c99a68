#!/usr/bin/env python3
"""compare_optimizers.py - AdamW, Lion, Adafactor and Muon on the fortunes job, same run, same machine.

Three phases, each one `tessera train` process per case (configs/fortunes.toml, its data
prepared by `make train` or on first use):

  1. learning-rate sweep: every optimizer at each of its --lrs, --sweep-steps steps;
     while the lowest validation loss sits at an end of the grid, the grid grows by a
     factor of 2 past that end (at most --max-extensions points per optimizer), so the
     kept lr is an interior minimum of the grid (or the table says it is not);
  2. equal steps: every optimizer at its kept lr for --steps steps (schedule: the job's
     warm-up and cosine decay over those steps);
  3. equal wall time: every optimizer for the number of steps its median step time fits
     into AdamW's phase-2 training time (the same schedule shape over those steps).

Validation loss: the job's val.bin, --eval-batches batches (the final evaluation of each run).
Training time: the sum of the run's step times (metrics.jsonl step_s), compile excluded.
Optimizer state bytes per parameter: the run summary's figure.

  python3 bench/compare_optimizers.py --markdown bench/results/DATE-optimizers-fortunes.md

A table goes to stdout; the last line is a JSON object with every figure.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

# Centred on the best of the first sweep (bench/results/2026-11-27-optimizers-fortunes.md);
# the sweep extends a grid whose end holds the best loss.
DEFAULT_LRS = {
    "adamw": [5e-4, 1e-3, 2e-3],
    "lion": [2e-4, 4e-4, 8e-4],
    "adafactor": [4e-3, 8e-3, 1.6e-2],
    "muon": [4e-3, 8e-3, 1.6e-2],
}


def run(binary, config, run_dir, name, lr, steps, eval_batches, threads):
    cmd = [binary, "train", "--config", config, "--quiet",
           "--set", f"optimizer.name={name}", "--set", f"optimizer.lr={lr}",
           "--set", f"train.steps={steps}", "--set", "train.time_limit_s=0",
           "--set", "train.eval_interval=0", "--set", f"train.eval_batches={eval_batches}",
           "--set", f"schedule.warmup_steps={max(1, steps // 18)}",
           "--set", "checkpoint.interval=0", "--set", "run.tensorboard=false",
           "--set", f"run.dir={run_dir}"]
    if threads:
        cmd += ["--set", f"run.threads={threads}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"compare_optimizers: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    steps_s, val = [], None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "step_s" in record:
                steps_s.append(record["step_s"])
            if record.get("final") and "val_loss" in record:
                val = record["val_loss"]
    state = re.search(r"state [0-9.]+ [KMG]?B \(([0-9.]+) bytes per parameter\)", out.stdout)
    shutil.rmtree(run_dir, ignore_errors=True)
    # metrics.jsonl has one record per log interval: the step time of the logged steps.
    return {"optimizer": name, "lr": lr, "steps": steps, "val_loss": val,
            "median_step_s": statistics.median(steps_s) if steps_s else None,
            "train_s": statistics.median(steps_s) * steps if steps_s else None,
            "state_bytes_per_param": float(state.group(1)) if state else None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="build/bin/tessera")
    p.add_argument("--config", default="configs/fortunes.toml")
    p.add_argument("--optimizers", default="adamw,lion,adafactor,muon")
    p.add_argument("--sweep-steps", type=int, default=300)
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--lrs", default="", help="name=lr,lr;name=lr,... (default: a 3-point grid per optimizer)")
    p.add_argument("--max-extensions", type=int, default=4,
                   help="points the sweep may add past an end of the grid that holds the best loss")
    p.add_argument("--markdown", default="")
    a = p.parse_args()
    names = a.optimizers.split(",")
    lrs = dict(DEFAULT_LRS)
    for part in filter(None, a.lrs.split(";")):
        name, values = part.split("=")
        lrs[name] = [float(v) for v in values.split(",")]
    work = tempfile.mkdtemp(prefix="tessera-optim-")

    sweep = []
    interior = {}
    for name in names:
        grid = sorted(lrs[name])
        results = {}

        def try_lr(lr):
            r = run(a.binary, a.config, os.path.join(work, "run"), name, lr, a.sweep_steps, a.eval_batches, a.threads)
            print(f"sweep  {name:<10} lr {lr:<8g} val {r['val_loss']:.4f}  step {r['median_step_s']:.3f} s", flush=True)
            sweep.append(r)
            results[lr] = r["val_loss"]

        for lr in grid:
            try_lr(lr)
        extensions = 0
        while True:
            best = min(grid, key=lambda lr: results[lr])
            at_edge = len(grid) > 1 and best in (grid[0], grid[-1])
            if not at_edge or extensions >= a.max_extensions:
                break
            lr = best / 2 if best == grid[0] else best * 2
            grid = sorted(grid + [lr])
            try_lr(lr)
            extensions += 1
        lrs[name] = grid
        interior[name] = not at_edge
    best_lr = {n: min((r for r in sweep if r["optimizer"] == n), key=lambda r: r["val_loss"])["lr"] for n in names}

    equal_steps = {}
    for name in names:
        equal_steps[name] = run(a.binary, a.config, os.path.join(work, "run"), name, best_lr[name], a.steps,
                                a.eval_batches, a.threads)
        r = equal_steps[name]
        print(f"steps  {name:<10} {r['steps']} steps val {r['val_loss']:.4f}  train {r['train_s']:.1f} s", flush=True)

    reference = equal_steps["adamw" if "adamw" in names else names[0]]
    equal_time = {}
    for name in names:
        steps = max(1, round(reference["train_s"] / equal_steps[name]["median_step_s"]))
        if steps == a.steps:
            equal_time[name] = equal_steps[name]
        else:
            equal_time[name] = run(a.binary, a.config, os.path.join(work, "run"), name, best_lr[name], steps,
                                   a.eval_batches, a.threads)
        r = equal_time[name]
        print(f"time   {name:<10} {r['steps']} steps val {r['val_loss']:.4f}  train {r['train_s']:.1f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)

    header = ("| optimizer | lr (swept) | state bytes/param | val loss @ {} steps | train s | "
              "steps in AdamW's time | val loss @ equal time |").format(a.steps)
    lines = [header, "|" + "---|" * 7]
    for name in names:
        s, t = equal_steps[name], equal_time[name]
        swept = ", ".join(f"{lr:g}" for lr in lrs[name])
        edge = "" if interior[name] else ", at the grid's end"
        lines.append(f"| {name} | {best_lr[name]:g}{edge} ({swept}) | {s['state_bytes_per_param']:.2f} | "
                     f"{s['val_loss']:.4f} | {s['train_s']:.1f} | {t['steps']} | {t['val_loss']:.4f} |")
    table = "\n".join(lines)
    print(table)
    result = {"bench": "compare_optimizers", "config": a.config, "steps": a.steps, "sweep_steps": a.sweep_steps,
              "sweep": sweep, "best_lr": best_lr,
              "best_lr_interior": interior, "equal_steps": equal_steps, "equal_time": equal_time}
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(f"# Optimizers on the fortunes job\n\nCommand: `python3 bench/{os.path.basename(__file__)} "
                    f"{' '.join(sys.argv[1:])}`\n\n{table}\n\n```json\n{json.dumps(result, indent=1)}\n```\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
