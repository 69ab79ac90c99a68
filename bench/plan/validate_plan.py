#!/usr/bin/env python3
"""The planner against measured runs: `tessera plan` predicts step time and peak memory
per device for a set of configurations, `tessera train` measures them on this machine
(CPU virtual devices in one process, and processes under mpirun), and the table shows
predicted / measured. The committed H100 run (bench/results/2026-11-26-gpu-h100.md)
is a row too, predicted from the catalog's h100 entry (its memory without the validation
program's arena: bench_gpu_train compiles the step alone).

    python3 bench/plan/validate_plan.py [--tessera build/bin/tessera] [--steps 12]
        [--only tiny] [--no-mpi]

Measured step time: the median step of `tessera goodput RUN --json` (step_stats).
Measured memory: the allocator's high-water mark during the steps after the first two
(metrics.jsonl peak_bytes, per process) divided by the devices of the process; the runs
save no checkpoint before their end (a save's staging copy is not the step's memory).
The JSON last line has step_time_error_max, step_time_error_median (|predicted /
measured - 1|) and memory_error_max.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, config, mesh, extra --set overrides, processes): processes > 1 runs under mpirun
# with one device per process.
CONFIGS = [
    ("tiny 1", "configs/tiny.toml", "data=1", [], 1),
    ("tiny dp2", "configs/tiny.toml", "data=2", [], 1),
    ("tiny fsdp2", "configs/tiny.toml", "fsdp=2", [], 1),
    ("tiny tp2", "configs/tiny.toml", "tensor=2", [], 1),
    ("tiny dp2 tp2", "configs/tiny.toml", "data=2,tensor=2", [], 1),
    ("tiny fsdp4", "configs/tiny.toml", "fsdp=4", [], 1),
    ("small 1", "configs/small.toml", "data=1", [], 1),
    ("small dp2", "configs/small.toml", "data=2", [], 1),
    ("small fsdp2", "configs/small.toml", "fsdp=2", [], 1),
    ("small tp2", "configs/small.toml", "tensor=2", [], 1),
    ("small fsdp2 tp2", "configs/small.toml", "fsdp=2,tensor=2", [], 1),
    ("small bf16", "configs/small.toml", "data=1", ["model.compute_dtype=bfloat16"], 1),
    ("gpt2-124m 1", "configs/tiny.toml", "data=1", ["model.preset=gpt2-124m", "train.batch=4"], 1),
    ("tiny dp2 mpi", "configs/tiny.toml", "data=2", [], 2),
    ("small fsdp2 mpi", "configs/small.toml", "fsdp=2", [], 2),
]

# The committed H100 run: GPT-2 124M, batch 16 x 1024, bf16 (call 3 of
# bench/results/2026-11-26-gpu-h100.md: 42.19 ms per step, 8.69 GB peak device memory).
H100_ROW = ("gpt2-124m h100 (committed)", 0.04219, 8.69e9)


def run(cmd, env=None, timeout=1800):
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return r.stdout


def devices_per_process(mesh, processes):
    n = 1
    for part in mesh.split(","):
        n *= int(part.split("=")[1])
    return n // processes


def measure(tessera, config, mesh, sets, processes, steps):
    run_dir = tempfile.mkdtemp(prefix="validate-plan-")
    args = [tessera, "train", "--config", config, "--quiet", "--set", f"run.dir={run_dir}",
            "--set", f"train.steps={steps}", "--set", "train.log_interval=1", "--set", "train.eval_batches=1",
            "--set", f"parallel.mesh={mesh}",
            # No checkpoint before the end: a save's staging copy is not the step's memory.
            "--set", "checkpoint.interval=0", "--set", 'checkpoint.local_dir=""', "--set", "schedule.warmup_steps=0"]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ)
    if processes > 1:
        args = ["mpirun", "-n", str(processes), "--oversubscribe", "--bind-to", "none"] + args
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    run(args, env=env)
    report = json.loads(run([tessera, "goodput", run_dir, "--json"]))
    step_s = report["step_stats"]["median_s"]
    peaks = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("step", 0) > 2 and "peak_bytes" in rec:
                peaks.append(rec["peak_bytes"])
    shutil.rmtree(run_dir, ignore_errors=True)
    memory = max(peaks) / devices_per_process(mesh, processes) if peaks else None
    return step_s, memory


def predict(tessera, config, mesh, sets, accelerator="host"):
    args = [tessera, "plan", "--config", config, "--accelerators", accelerator, "--mesh", mesh, "--json"]
    for s in sets:
        args += ["--set", s]
    out = json.loads(run(args).strip().splitlines()[-1])
    row = out["strong_scaling"][0]
    if not row["found"]:
        raise SystemExit(f"tessera plan found no layout for {config} {mesh}: {row['reason']}")
    return row["step_seconds"], row["memory"]["peak"], row["memory"]["eval"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build/bin/tessera"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", default="", help="run only configurations whose name contains this")
    ap.add_argument("--no-mpi", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, config, mesh, sets, processes in CONFIGS:
        if a.only and a.only not in name:
            continue
        if processes > 1 and (a.no_mpi or shutil.which("mpirun") is None):
            continue
        pred_s, pred_mem, _ = predict(a.tessera, config, mesh, sets)
        meas_s, meas_mem = measure(a.tessera, config, mesh, sets, processes, a.steps)
        rows.append((name, pred_s, meas_s, pred_mem, meas_mem))
        print(f"{name:<22} step predicted {pred_s * 1e3:9.2f} ms measured {meas_s * 1e3:9.2f} ms "
              f"({pred_s / meas_s:5.2f}x)   memory predicted {pred_mem / 1e6:8.1f} MB measured "
              f"{(meas_mem or 0) / 1e6:8.1f} MB", flush=True)
    if not a.only or "h100" in a.only:
        name, meas_s, meas_mem = H100_ROW
        pred_s, pred_mem, pred_eval = predict(a.tessera, "configs/gpt2-124m.toml", "data=1",
                                              ["train.batch=16", "train.seq=1024", "model.compute_dtype=bfloat16",
                                               "train.micro_batch=0"], accelerator="h100")
        # bench_gpu_train compiles the step only, not the trainer's validation program.
        pred_mem -= pred_eval
        rows.append((name, pred_s, meas_s, pred_mem, meas_mem))
        print(f"{name:<22} step predicted {pred_s * 1e3:9.2f} ms measured {meas_s * 1e3:9.2f} ms "
              f"({pred_s / meas_s:5.2f}x)   memory predicted {pred_mem / 1e9:8.2f} GB measured "
              f"{meas_mem / 1e9:8.2f} GB")
    step_err = [abs(p / m - 1) for _, p, m, _, _ in rows]
    mem_err = [abs(p / m - 1) for _, _, _, p, m in rows if m]
    result = {
        "bench": "validate_plan",
        "configurations": len(rows),
        "step_time_error_max": max(step_err) if step_err else None,
        "step_time_error_median": statistics.median(step_err) if step_err else None,
        "memory_error_max": max(mem_err) if mem_err else None,
        "rows": [{"name": n, "predicted_s": p, "measured_s": m, "predicted_bytes": pb, "measured_bytes": mb}
                 for n, p, m, pb, mb in rows],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
