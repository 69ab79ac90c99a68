#!/usr/bin/env python3
"""The planner against measured runs: `tessera plan` predicts step time and peak memory
per device for a set of configurations, `tessera train` measures them on this machine
(CPU virtual devices in one process, and processes under mpirun), and the table shows
predicted / measured. The newest committed GPU run (bench/results/2026-11-28c-gpu-h200.md)
is a row too, predicted from the catalog's entry for its GPU (its memory without the
validation program's arena: bench_gpu_train compiles the step alone).

    python3 bench/plan/validate_plan.py [--tessera build/bin/tessera] [--steps 12]
        [--rounds 3] [--only tiny] [--no-mpi]

Measured step time: the median step of `tessera goodput RUN --json` (step_stats).
Measured memory: the allocator's high-water mark from the first evaluation on (every
--eval-interval steps: the validation program's arena stays allocated after it, and the
plan counts it) (metrics.jsonl peak_bytes, per process), divided by the devices of the
process; the runs save no checkpoint before their end (a save's staging copy is not
the step's memory).

Rounds: every configuration is predicted and measured once per round, the rounds
interleaved (a slow minute of a shared machine then touches one sample of each row,
not all of one), and each row reports the median over the rounds of its predicted and
of its measured step. The JSON last line has step_time_error_max,
step_time_error_median (|predicted / measured - 1| of the medians), memory_error_max,
and each row's per-round figures.
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
    # Pipelines under mpirun: each process holds its stages' parameters and optimizer state
    # (stage-local, train/pipeline_step.h), as the planner counts it per chip.
    ("tiny pp2 mpi", "configs/tiny.toml", "pipeline=2", [], 2),
    ("tiny pp2 gpipe mpi", "configs/tiny.toml", "pipeline=2", ["parallel.pipeline_schedule=gpipe"], 2),
    ("tiny pp2 keep mpi", "configs/tiny.toml", "pipeline=2", ["parallel.pipeline_recompute=false"], 2),
    # The micro-batch counts the planner's search tries besides the automatic 4
    # (Planner::pipeline_micro_batch_counts): its ranking of them should be the measured one.
    ("tiny pp2 m=2 mpi", "configs/tiny.toml", "pipeline=2", ["parallel.pipeline_micro_batches=2"], 2),
    ("tiny pp2 m=8 mpi", "configs/tiny.toml", "pipeline=2", ["parallel.pipeline_micro_batches=8"], 2),
    # Stages partitioned over FSDP under mpirun: each process keeps its shards of its stages'
    # state (PipelineTrainStep::shards_state), recomputing or keeping the activations.
    ("tiny pp2 fsdp2 mpi", "configs/tiny.toml", "pipeline=2,fsdp=2", [], 4),
    ("tiny pp2 fsdp2 keep mpi", "configs/tiny.toml", "pipeline=2,fsdp=2", ["parallel.pipeline_recompute=false"], 4),
]

# The newest committed GPU run: GPT-2 124M, batch 16 x 1024, bf16, cuDNN attention (phase
# `cudnn` of bench/results/2026-11-28c-gpu-h200.md: 33.78 ms per step, 8,746,623,488 bytes
# allocator peak). Its program is today's but for two later fusions (the DGELU epilogue,
# 1.25 ms of gelu_tanh_grad kernels in that run's profile, and the casts in one group), so
# the plan of today's program is a little fast for it. Earlier runs (the H100's of 2026-11-26
# and 2026-11-28b) ran tessera's own attention kernels and an unfused clip and GELU
# backward: the plan of today's program no longer describes them. The next device call's
# bench phase (tools/gpu-bundle-check.sh) gives the figure to put here.
GPU_ROW = ("gpt2-124m h200 (committed)", "h200", 0.03378, 8.746623488e9)


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


def measure(tessera, config, mesh, sets, processes, steps, eval_interval):
    run_dir = tempfile.mkdtemp(prefix="validate-plan-")
    args = [tessera, "train", "--config", config, "--quiet", "--set", f"run.dir={run_dir}",
            "--set", f"train.steps={steps}", "--set", "train.log_interval=1", "--set", "train.eval_batches=1",
            "--set", f"train.eval_interval={eval_interval}",
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
            if rec.get("step", 0) >= eval_interval and "peak_bytes" in rec:
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
    ap.add_argument("--eval-interval", type=int, default=3, help="steps between evaluations (< --steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="run only configurations whose name contains this")
    ap.add_argument("--no-mpi", action="store_true")
    a = ap.parse_args()
    if not 0 < a.eval_interval < a.steps:
        raise SystemExit("--eval-interval must be between 1 and --steps - 1: the measured memory starts at the "
                         "first evaluation")
    configs = [c for c in CONFIGS if (not a.only or a.only in c[0]) and
               (c[4] == 1 or (not a.no_mpi and shutil.which("mpirun") is not None))]
    samples = {c[0]: [] for c in configs}  # name -> [(predicted s, measured s, predicted B, measured B)]
    for r in range(a.rounds):
        for name, config, mesh, sets, processes in configs:
            pred_s, pred_mem, _ = predict(a.tessera, config, mesh, sets)
            meas_s, meas_mem = measure(a.tessera, config, mesh, sets, processes, a.steps, a.eval_interval)
            samples[name].append((pred_s, meas_s, pred_mem, meas_mem))
            print(f"round {r + 1} {name:<22} step predicted {pred_s * 1e3:9.2f} ms measured {meas_s * 1e3:9.2f} ms "
                  f"({pred_s / meas_s:5.2f}x)   memory predicted {pred_mem / 1e6:8.1f} MB measured "
                  f"{(meas_mem or 0) / 1e6:8.1f} MB", flush=True)
    rows = []
    print(f"medians over {a.rounds} rounds:")
    for name, _, _, _, _ in configs:
        runs = samples[name]
        pred_s = statistics.median(x[0] for x in runs)
        meas_s = statistics.median(x[1] for x in runs)
        pred_mem = statistics.median(x[2] for x in runs)
        measured_mems = [x[3] for x in runs if x[3]]
        meas_mem = statistics.median(measured_mems) if measured_mems else None
        rows.append((name, pred_s, meas_s, pred_mem, meas_mem, runs))
        print(f"{name:<22} step predicted {pred_s * 1e3:9.2f} ms measured {meas_s * 1e3:9.2f} ms "
              f"({pred_s / meas_s:5.2f}x)   memory predicted {pred_mem / 1e6:8.1f} MB measured "
              f"{(meas_mem or 0) / 1e6:8.1f} MB", flush=True)
    if not a.only or GPU_ROW[1] in a.only:
        name, accelerator, meas_s, meas_mem = GPU_ROW
        pred_s, pred_mem, pred_eval = predict(a.tessera, "configs/gpt2-124m.toml", "data=1",
                                              ["train.batch=16", "train.seq=1024", "model.compute_dtype=bfloat16",
                                               "train.micro_batch=0"], accelerator=accelerator)
        # bench_gpu_train compiles the step only, not the trainer's validation program.
        pred_mem -= pred_eval
        rows.append((name, pred_s, meas_s, pred_mem, meas_mem, [(pred_s, meas_s, pred_mem, meas_mem)]))
        print(f"{name:<22} step predicted {pred_s * 1e3:9.2f} ms measured {meas_s * 1e3:9.2f} ms "
              f"({pred_s / meas_s:5.2f}x)   memory predicted {pred_mem / 1e9:8.2f} GB measured "
              f"{meas_mem / 1e9:8.2f} GB")
    step_err = [abs(p / m - 1) for _, p, m, _, _, _ in rows]
    mem_err = [abs(p / m - 1) for _, _, _, p, m, _ in rows if m]
    result = {
        "bench": "validate_plan",
        "configurations": len(rows),
        "rounds": a.rounds,
        "step_time_error_max": max(step_err) if step_err else None,
        "step_time_error_median": statistics.median(step_err) if step_err else None,
        "memory_error_max": max(mem_err) if mem_err else None,
        "rows": [{"name": n, "predicted_s": p, "measured_s": m, "predicted_bytes": pb, "measured_bytes": mb,
                  "rounds": [{"predicted_s": x[0], "measured_s": x[1], "predicted_bytes": x[2],
                              "measured_bytes": x[3]} for x in runs]}
                 for n, p, m, pb, mb, runs in rows],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
