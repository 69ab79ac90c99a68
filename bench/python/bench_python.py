"""bench_python: the cost of driving tessera from Python.

1. A jitted GPT training step (forward, backward, global-norm clip, AdamW; params and
   optimizer state donated) written in Python with tessera.models / tessera.optim, against
   build/bin/bench_train (the same step in C++: train::TrainStep) on the same shape and
   thread count. Rounds are interleaved (C++, Python, C++, Python, ...); each round is the
   median step time of --steps timed steps after --warmup; the ratio is of the medians
   over rounds.
2. The per-call overhead of a jitted no-op (identity on a 4-element array) called from
   Python: median over batches of calls.

    PYTHONPATH=build/python python3 bench/python/bench_python.py [--preset tiny] [--rounds 3]

A table goes to stdout; the last line is one JSON object with python_vs_cpp_tokens_per_s
and jit_call_overhead_us.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--preset", default="tiny")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--calls", type=int, default=20000, help="jitted no-op calls per overhead batch")
parser.add_argument("--build-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "build"))
args = parser.parse_args()

os.environ["TESSERA_NUM_THREADS"] = str(args.threads)  # before the pool starts
import tessera as ts  # noqa: E402

bench_train = os.path.join(args.build_dir, "bin", "bench_train")
if not os.access(bench_train, os.X_OK):
    sys.exit(f"bench_python: {bench_train} not found (build it: cmake --build build --target bench_train)")


def cpp_round():
    out = subprocess.run(
        [bench_train, "--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch",
         str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads)],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


# The Python step: the same model, optimizer settings and data as bench_train.
model = ts.models.Model(args.preset)
if model.context < args.seq:
    model = ts.models.Model(args.preset, context=args.seq)
opt = ts.optim.Optimizer(model, name="adamw", beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip_norm=1.0,
                         no_decay=["bias", "norm"])


def train_step(params, state, tokens, targets, lr):
    loss, grads = ts.value_and_grad(model.loss)(params, tokens, targets)
    params, state, _ = opt.apply(params, grads, state, lr)
    return params, state, loss


step = ts.jit(train_step, donate_argnums=(0, 1))
rng = np.random.default_rng(1)
batches = []
for _ in range(args.warmup + args.steps):
    ids = rng.integers(0, model.vocab, (args.batch, args.seq + 1)).astype(np.int32)
    batches.append((ts.array(ids[:, :-1]), ts.array(ids[:, 1:])))
lr = ts.array(3e-4)


def python_round():
    params = model.init(0)
    state = opt.init(params)
    times = []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        params, state, loss = step(params, state, x, y, lr)
        float(loss)  # the step's one synchronization, as TrainStep reads its loss
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


cpp_ms, py_ms = [], []
for r in range(args.rounds):
    cpp = cpp_round()
    cpp_ms.append(cpp["step_ms"])
    py_ms.append(1e3 * python_round())
tokens = args.batch * args.seq
cpp_tps = tokens / (statistics.median(cpp_ms) / 1e3)
py_tps = tokens / (statistics.median(py_ms) / 1e3)

# Per-call overhead of a jitted no-op.
noop = ts.jit(lambda v: v)
small = ts.ones((4,))
noop(small)
per_call = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(args.calls):
        noop(small)
    per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
overhead_us = statistics.median(per_call)

print(f"bench_python: {args.preset}, batch {args.batch} x seq {args.seq}, {args.threads} threads, {args.rounds} "
      f"interleaved rounds of {args.steps} steps; {platform.processor() or platform.machine()}")
print("| | step ms (median of rounds) | tokens/s |")
print("| --- | --- | --- |")
print(f"| C++ bench_train (train::TrainStep) | {statistics.median(cpp_ms):.1f} | {cpp_tps:.0f} |")
print(f"| Python: jit(value_and_grad + Optimizer.apply) | {statistics.median(py_ms):.1f} | {py_tps:.0f} |")
print(f"python / C++ tokens/s: {py_tps / cpp_tps:.3f}; jitted no-op call from Python: {overhead_us:.2f} us")
print(json.dumps({
    "bench": "python", "preset": args.preset, "batch": args.batch, "seq": args.seq, "threads": args.threads,
    "rounds": args.rounds, "steps": args.steps, "cpp_step_ms": cpp_ms, "python_step_ms": [round(v, 3) for v in py_ms],
    "cpp_tokens_per_s": round(cpp_tps, 1), "python_tokens_per_s": round(py_tps, 1),
    "python_vs_cpp_tokens_per_s": round(py_tps / cpp_tps, 4), "jit_call_overhead_us": round(overhead_us, 3),
    "jit_call_overhead_batches_us": [round(v, 3) for v in per_call],
}))
