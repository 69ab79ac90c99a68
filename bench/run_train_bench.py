#!/usr/bin/env python3
"""run_train_bench.py - GPT training tokens/s and MFU: tessera against PyTorch (eager, torch.compile) and JAX.

For each shape and each of --rounds rounds, runs one process per contender, interleaved (the order
rotates every round) so that drift of a shared or throttled machine hits every contender alike:

  tessera        build/bin/bench_train --preset SHAPE --steps N --warmup W --threads T
  torch-eager    bench/peers/torch_gpt_cpu.py, env: LD_PRELOAD tcmalloc; OpenMP spin-waits as by default
  torch-compile  the same with --compile (more warm-up steps: the first step compiles)
  jax            bench/peers/jax_gpt_cpu.py (jax.jit)

Every process runs under `taskset -c CPUS`: XLA sizes its CPU thread pool from the affinity mask,
and it caps the others at the same cores. Each prints a JSON object on its last stdout line; the
table shows medians over rounds of each run's median step time. FLOPs/token = 6*N + 12*L*T*d with N
all parameters but the position table (PaLM / nanoGPT convention, as bench/peers/torch_gpt_cpu.py);
MFU = achieved FLOP/s / --peak-gflops (default 200: 2 Zen 3 cores x 32 fp32 flop/cycle x ~3.1 GHz;
give this machine's, e.g. 230 on a 3.6 GHz Zen 4). bench_train gets the same value.

  python3 bench/run_train_bench.py                 # everything; the peers' venv is made on first use
  python3 bench/run_train_bench.py --peers-only --rounds 3 --markdown bench/results/DATE-train-peers.md

The last stdout line is a JSON object with every figure, plus tiny_vs_best_peer and
small_vs_best_peer = tessera tokens/s / fastest peer's tokens/s (null without tessera).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_DIR = os.path.join(ROOT, "bench", "peers")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

# name -> (vocab, layers, heads, dim, seq, batch); the presets of build/bin/bench_train.
SHAPES = {
    "tiny": (256, 4, 4, 256, 256, 8),
    "small": (4096, 6, 6, 384, 256, 8),
}
PEERS = ["torch-eager", "torch-compile", "jax"]

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--shapes", default="tiny,small", help="comma-separated, from: " + ",".join(SHAPES))
ap.add_argument("--contenders", default="tessera," + ",".join(PEERS), help="comma-separated subset")
ap.add_argument("--peers-only", action="store_true", help="leave tessera out")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
ap.add_argument("--compile-warmup", type=int, default=4, help="untimed steps for torch.compile and jax")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--cpus", default=None, help="taskset CPU list (default: 0..threads-1)")
ap.add_argument("--peak-gflops", type=float, default=200.0)
ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "bench_train"))
ap.add_argument("--python", default=None, help="python of the peers' venv (default: made by bench/peers/setup_venv.sh)")
ap.add_argument("--timeout", type=float, default=1200, help="seconds per run")
ap.add_argument("--markdown", default=None, help="also write a report (machine, command, table) to this file")
ap.add_argument("--note", default="", help="a line added to the --markdown report")
args = ap.parse_args()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def flops_per_token(vocab, layers, heads, dim, seq, batch):
    """6*N + 12*L*T*d; N = parameters without the position table (tied embedding counted once)."""
    per_layer = 2 * 2 * dim + (3 * dim * dim + 3 * dim) + (dim * dim + dim) + (4 * dim * dim + 4 * dim) \
        + (4 * dim * dim + dim)
    n = vocab * dim + layers * per_layer + 2 * dim
    return 6 * n + 12 * layers * seq * dim


_PY = []


def peers_python():
    if args.python:
        return args.python
    if _PY:
        return _PY[0]
    setup = os.path.join(PEERS_DIR, "setup_venv.sh")
    log(f"peers venv: bash {setup} (cached; the first time installs ~5 GB from PyPI, ~4 min)")
    out = subprocess.run(["bash", setup], stdout=subprocess.PIPE, text=True, check=True).stdout
    _PY.append(os.path.join(out.strip().splitlines()[-1], "bin", "python"))
    return _PY[0]


def command(contender, shape, py):
    vocab, layers, heads, dim, seq, batch = SHAPES[shape]
    model = ["--vocab", vocab, "--layers", layers, "--heads", heads, "--dim", dim, "--seq", seq, "--batch", batch]
    env = dict(os.environ)
    if contender == "tessera":
        cmd = [args.binary, "--preset", shape, "--steps", args.steps, "--warmup", args.warmup,
               "--threads", args.threads, "--peak-gflops", args.peak_gflops]
    elif contender.startswith("torch"):
        warm = args.compile_warmup if contender == "torch-compile" else args.warmup
        cmd = [py, os.path.join(PEERS_DIR, "torch_gpt_cpu.py"), *model, "--steps", args.steps, "--warmup", warm,
               "--threads", args.threads] + (["--compile"] if contender == "torch-compile" else [])
        env.update(LD_PRELOAD=TCMALLOC)  # OpenMP keeps its default spin-wait: bench/peers/README.md
    elif contender == "jax":
        cmd = [py, os.path.join(PEERS_DIR, "jax_gpt_cpu.py"), *model, "--steps", args.steps,
               "--warmup", args.compile_warmup, "--threads", args.threads]
    else:
        raise ValueError(contender)
    cpus = args.cpus or ",".join(str(i) for i in range(args.threads))
    return ["taskset", "-c", cpus] + [str(c) for c in cmd], env


def run_once(contender, shape, py):
    cmd, env = command(contender, shape, py)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}, cmd
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}, cmd
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"last stdout line is not JSON: {lines[-1][:200]}"}, cmd
    if "tokens_per_s" not in result:
        return {"error": "no tokens_per_s in the JSON line"}, cmd
    result["wall_s"] = round(time.time() - t0, 1)
    return result, cmd


def main():
    shapes = [s for s in args.shapes.split(",") if s]
    contenders = [c for c in args.contenders.split(",") if c]
    for name in shapes:
        if name not in SHAPES:
            sys.exit(f"--shapes: unknown shape '{name}', expected some of {','.join(SHAPES)}")
    for c in contenders:
        if c not in ["tessera", *PEERS]:
            sys.exit(f"--contenders: unknown '{c}', expected some of tessera,{','.join(PEERS)}")
    notes = []
    if "tessera" in contenders and (args.peers_only or not os.access(args.binary, os.X_OK)):
        if not args.peers_only:
            notes.append(f"tessera left out: {args.binary} does not exist (build it: cmake --build build "
                         "--target bench_train); peers only")
            log("warning: " + notes[-1])
        contenders.remove("tessera")
    if not contenders:
        sys.exit("nothing to run: --contenders/--peers-only left no contender")
    py = peers_python() if any(c in PEERS for c in contenders) else None

    load_before = os.getloadavg()
    runs = {s: {c: [] for c in contenders} for s in shapes}
    commands = {}
    n_total, n_done = args.rounds * len(shapes) * len(contenders), 0
    t_start = time.time()
    for r in range(args.rounds):
        for shape in shapes:
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for c in order:
                result, cmd = run_once(c, shape, py)
                prefix = f"LD_PRELOAD={TCMALLOC} " if c.startswith("torch") else ""
                commands[f"{shape}/{c}"] = prefix + " ".join(shlex.quote(x) for x in cmd)
                runs[shape][c].append(result)
                n_done += 1
                eta = (time.time() - t_start) / n_done * (n_total - n_done)
                status = result.get("error") or f"{result['tokens_per_s']:.0f} tok/s, {result['wall_s']} s"
                log(f"[{n_done}/{n_total} round {r + 1} {shape} {c}] {status}  (ETA {eta / 60:.1f} min)")

    summary = {}
    for shape in shapes:
        vocab, layers, heads, dim, seq, batch = SHAPES[shape]
        fpt = flops_per_token(*SHAPES[shape])
        summary[shape] = {}
        for c in contenders:
            ok = [x for x in runs[shape][c] if "error" not in x]
            entry = {"runs_ok": len(ok), "runs": len(runs[shape][c]),
                     "errors": [x["error"] for x in runs[shape][c] if "error" in x]}
            if ok:
                tok = statistics.median(x["tokens_per_s"] for x in ok)
                reported_fpt = ok[0].get("flops_per_token", ok[0].get("model_flops_per_token"))
                if reported_fpt and abs(reported_fpt - fpt) > 0.01 * fpt:
                    notes.append(f"{shape}/{c} reports flops_per_token {reported_fpt}, this script uses {fpt}")
                entry.update({
                    "tokens_per_s": round(tok, 1),
                    "tokens_per_s_runs": [x["tokens_per_s"] for x in ok],
                    "step_ms": round(1e3 * batch * seq / tok, 2),
                    "achieved_gflops": round(fpt * tok / 1e9, 2),
                    "mfu": round(fpt * tok / 1e9 / args.peak_gflops, 4),
                    "flops_per_token": fpt,
                    "loss_last": [x.get("loss_last") for x in ok],
                })
            summary[shape][c] = entry

    rows = ["| contender | shape | step ms | tokens/s (runs) | achieved GFLOP/s | MFU | runs ok |",
            "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for c in contenders:
            e = summary[shape][c]
            if "tokens_per_s" in e:
                runs_txt = ", ".join(f"{t:.0f}" for t in e["tokens_per_s_runs"])
                rows.append(f"| {c} | {shape} | {e['step_ms']:.1f} | {e['tokens_per_s']:.0f} ({runs_txt}) | "
                            f"{e['achieved_gflops']:.1f} | {100 * e['mfu']:.1f}% | {e['runs_ok']}/{e['runs']} |")
            else:
                rows.append(f"| {c} | {shape} | - | - | - | - | 0/{e['runs']}: {e['errors'][:1]} |")
    ratios = {}
    for shape in shapes:
        peers = [(summary[shape][c]["tokens_per_s"], c) for c in contenders
                 if c != "tessera" and "tokens_per_s" in summary[shape][c]]
        best = max(peers) if peers else None
        mine = summary[shape].get("tessera", {}).get("tokens_per_s")
        ratios[f"{shape}_vs_best_peer"] = round(mine / best[0], 3) if (mine and best) else None
        ratios[f"{shape}_best_peer"] = best[1] if best else None
    table = "\n".join(rows)
    ratio_txt = ", ".join(f"{s}: {ratios[f'{s}_vs_best_peer']} (best peer {ratios[f'{s}_best_peer']})" for s in shapes)

    final = {"results": summary, **ratios, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
             "compile_warmup": args.compile_warmup, "threads": args.threads, "peak_gflops": args.peak_gflops,
             "load_avg_before": [round(x, 2) for x in load_before],
             "load_avg_after": [round(x, 2) for x in os.getloadavg()], "commands": commands, "notes": notes}
    print(table)
    print(f"\ntessera / fastest peer (tokens/s): {ratio_txt}")
    for n in notes:
        print(f"note: {n}")
    if args.markdown:
        write_markdown(table, ratio_txt, final)
    print(json.dumps(final))


def write_markdown(table, ratio_txt, final):
    info = {}
    for ln in open("/proc/cpuinfo"):
        key, _, val = ln.partition(":")
        info.setdefault(key.strip(), val.strip())
    simd = "AVX-512" if "avx512f" in info.get("flags", "").split() else "AVX2, no AVX-512"
    cpu = f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, {simd})"
    versions = subprocess.run(
        [peers_python(), "-c", "import torch, jax, optax, numpy; print(f'torch {torch.__version__}, "
         "jax/jaxlib {jax.__version__}, optax {optax.__version__}, numpy {numpy.__version__}')"],
        capture_output=True, text=True).stdout.strip() if any(c != "tessera" for s in final["results"].values()
                                                               for c in s) else ""
    lines = [
        f"# GPT training throughput: tessera vs peers ({datetime.date.today()})", "",
        f"Command: `python3 bench/run_train_bench.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`", "",
        f"Machine: {cpu}, {os.cpu_count()} CPUs, {platform.platform()}; peak used for MFU: "
        f"{args.peak_gflops:g} GFLOP/s. {versions}. Python {platform.python_version()} (venv).", "",
        f"Load average before: {final['load_avg_before']}, after: {final['load_avg_after']}.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += [table, "", f"tessera / fastest peer (tokens/s): {ratio_txt}", ""]
    lines += [f"- note: {n}" for n in final["notes"]]
    lines += ["", "Commands of the last round:", ""] + [f"- {k}: `{v}`" for k, v in final["commands"].items()]
    lines += ["", "Full JSON (the script's last line):", "", "```json", json.dumps(final, indent=1), "```", ""]
    with open(args.markdown, "w") as f:
        f.write("\n".join(lines))
    log(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
