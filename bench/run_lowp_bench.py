#!/usr/bin/env python3
"""run_lowp_bench.py - low-precision GPT training on the CPU: tessera bf16 and int8 against f32 and the peers' best.

For each shape and each of --rounds rounds, runs one process per contender, interleaved (the order rotates every
round), each under `taskset -c CPUS`:

  tessera-f32         build/bin/bench_train --preset SHAPE --compute-dtype float32
  tessera-bf16        build/bin/bench_train --preset SHAPE --compute-dtype bfloat16 (f32 master weights and AdamW;
                      GEMMs on the CPU's bf16 matrix units where it has them: `tessera info`'s "bf16 GEMM" line)
  tessera-int8        the bf16 run with every matmul of the blocks and the head in int8, forward and both backward
                      GEMMs (AQT: --quant attention,mlp,head; `tessera info`'s "int8 GEMM" line)
  torch-eager[-bf16]  bench/peers/torch_gpt_cpu.py [--autocast bf16] (env: LD_PRELOAD tcmalloc; OpenMP spin-waits as by default)
  torch-compile[-bf16] the same with --compile
  jax[-bf16]          bench/peers/jax_gpt_cpu.py [--compute-dtype bfloat16] (f32 params cast to bf16 in the loss)

The same model, optimizer and batch shapes as bench/run_train_bench.py (read its docstring). Each process prints a
JSON line; the table shows the median over rounds of each run's median step.

  python3 bench/run_lowp_bench.py --rounds 3 --markdown bench/results/DATE-lowp-bench.md

The last stdout line is a JSON object with every figure plus
  bf16_vs_f32_min        min over shapes of tessera-bf16 / tessera-f32 tokens/s
  bf16_vs_best_peer_min  min over shapes of tessera-bf16 / the fastest peer in any precision
  int8_vs_bf16_min       min over shapes of tessera-int8 / tessera-bf16 tokens/s
  cpu_features           the CPU's bf16/int8 matrix instructions (/proc/cpuinfo) and tessera's bf16 and int8 GEMM paths.
On a CPU without AVX512-BF16 or AMX the bf16 ratios are null, and without AMX-INT8 or AVX512-VNNI the int8 ratio is
null (tessera's int8 GEMM then multiplies in float64), with the reason in notes, instead of a figure.
"""
import argparse
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
SHAPES = {"tiny": (256, 4, 4, 256, 256, 8), "small": (4096, 6, 6, 384, 256, 8)}
TESSERA = ["tessera-f32", "tessera-bf16", "tessera-int8"]
PEERS = ["torch-eager", "torch-eager-bf16", "torch-compile", "torch-compile-bf16", "jax", "jax-bf16"]

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--shapes", default="tiny,small", help="comma-separated, from: " + ",".join(SHAPES))
ap.add_argument("--contenders", default=",".join(TESSERA + PEERS), help="comma-separated subset")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
ap.add_argument("--compile-warmup", type=int, default=4, help="untimed steps for torch.compile and jax")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--cpus", default=None, help="taskset CPU list (default: 0..threads-1)")
ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "bench_train"))
ap.add_argument("--python", default=None, help="python of the peers' venv (default: made by bench/peers/setup_venv.sh)")
ap.add_argument("--timeout", type=float, default=1200, help="seconds per run")
ap.add_argument("--markdown", default=None, help="also write a report (machine, command, table) to this file")
args = ap.parse_args()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cpu_features():
    flags = set()
    model = "?"
    for line in open("/proc/cpuinfo"):
        key, _, val = line.partition(":")
        if key.strip() == "flags" and not flags:
            flags = set(val.split())
        if key.strip() == "model name" and model == "?":
            model = val.strip()
    names = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"]
    features = {n: n in flags for n in names}
    features["model"] = model
    tessera = os.path.join(os.path.dirname(args.binary), "tessera")
    path = "unknown (no build/bin/tessera)"
    if os.access(tessera, os.X_OK):
        info = subprocess.run([tessera, "info"], capture_output=True, text=True).stdout
        path = next((ln.split("bf16 GEMM", 1)[1].strip() for ln in info.splitlines() if "bf16 GEMM" in ln), path)
    features["tessera_bf16_gemm"] = path
    int8_path = "unknown (no build/bin/tessera)"
    if os.access(tessera, os.X_OK):
        int8_path = next((ln.split("int8 GEMM", 1)[1].strip() for ln in info.splitlines() if "int8 GEMM" in ln),
                         int8_path)
    features["tessera_int8_gemm"] = int8_path
    return features


def peers_python():
    if args.python:
        return args.python
    out = subprocess.run(["bash", os.path.join(PEERS_DIR, "setup_venv.sh")], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return os.path.join(out.strip().splitlines()[-1], "bin", "python")


def command(contender, shape, py):
    vocab, layers, heads, dim, seq, batch = SHAPES[shape]
    model = ["--vocab", vocab, "--layers", layers, "--heads", heads, "--dim", dim, "--seq", seq, "--batch", batch]
    env = dict(os.environ)
    bf16 = contender.endswith("-bf16")
    if contender.startswith("tessera"):
        low = contender != "tessera-f32"
        cmd = [args.binary, "--preset", shape, "--steps", args.steps, "--warmup", args.warmup, "--threads",
               args.threads, "--compute-dtype", "bfloat16" if low else "float32"]
        if contender == "tessera-int8":
            cmd += ["--quant", "attention,mlp,head", "--quant-backward", "int8"]
    elif contender.startswith("torch"):
        compiled = contender.startswith("torch-compile")
        cmd = [py, os.path.join(PEERS_DIR, "torch_gpt_cpu.py"), *model, "--steps", args.steps, "--warmup",
               args.compile_warmup if compiled else args.warmup, "--threads", args.threads,
               "--autocast", "bf16" if bf16 else "off"] + (["--compile"] if compiled else [])
        env.update(LD_PRELOAD=TCMALLOC)  # OpenMP keeps its default spin-wait: bench/peers/README.md
    else:
        cmd = [py, os.path.join(PEERS_DIR, "jax_gpt_cpu.py"), *model, "--steps", args.steps, "--warmup",
               args.compile_warmup, "--threads", args.threads, "--compute-dtype", "bfloat16" if bf16 else "float32"]
    cpus = args.cpus or ",".join(str(i) for i in range(args.threads))
    return ["taskset", "-c", cpus] + [str(c) for c in cmd], env


def run_once(contender, shape, py):
    cmd, env = command(contender, shape, py)
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
    return (result if "tokens_per_s" in result else {"error": "no tokens_per_s"}), cmd


def main():
    shapes = [s for s in args.shapes.split(",") if s]
    contenders = [c for c in args.contenders.split(",") if c]
    for c in contenders:
        if c not in TESSERA + PEERS:
            sys.exit(f"--contenders: unknown '{c}', expected some of {','.join(TESSERA + PEERS)}")
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"--shapes: unknown '{s}', expected some of {','.join(SHAPES)}")
    features = cpu_features()
    notes = []
    py = peers_python() if any(c in PEERS for c in contenders) else None
    runs = {s: {c: [] for c in contenders} for s in shapes}
    commands = {}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for shape in shapes:
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for c in order:
                t0 = time.time()
                result, cmd = run_once(c, shape, py)
                prefix = f"LD_PRELOAD={TCMALLOC} " if c.startswith("torch") else ""
                commands[f"{shape}/{c}"] = prefix + " ".join(shlex.quote(x) for x in cmd)
                runs[shape][c].append(result)
                status = result.get("error") or f"{result['tokens_per_s']:.0f} tok/s"
                log(f"[round {r + 1} {shape} {c}] {status} ({time.time() - t0:.0f} s)")

    summary = {}
    rows = ["| contender | shape | step ms | tokens/s (runs) | loss last |", "|---|---|---|---|---|"]
    for shape in shapes:
        batch, seq = SHAPES[shape][5], SHAPES[shape][4]
        summary[shape] = {}
        for c in contenders:
            ok = [x for x in runs[shape][c] if "error" not in x]
            entry = {"runs_ok": len(ok), "errors": [x["error"] for x in runs[shape][c] if "error" in x]}
            if ok:
                tok = statistics.median(x["tokens_per_s"] for x in ok)
                last = ok[-1].get("loss_last", (ok[-1].get("losses") or [None])[-1])
                entry.update(tokens_per_s=round(tok, 1), tokens_per_s_runs=[x["tokens_per_s"] for x in ok],
                             step_ms=round(1e3 * batch * seq / tok, 2), loss_last=last)
                runs_txt = ", ".join(f"{t:.0f}" for t in entry["tokens_per_s_runs"])
                rows.append(f"| {c} | {shape} | {entry['step_ms']:.1f} | {tok:.0f} ({runs_txt}) | {last} |")
            else:
                rows.append(f"| {c} | {shape} | - | - | failed: {entry['errors'][:1]} |")
            summary[shape][c] = entry

    def tok(shape, c):
        return summary[shape].get(c, {}).get("tokens_per_s")

    has_bf16_units = features["avx512_bf16"] or features["amx_bf16"]
    ratios = {}
    bf16_vs_f32, bf16_vs_peer, int8_vs_bf16 = [], [], []
    for shape in shapes:
        peers = [(tok(shape, c), c) for c in contenders if c in PEERS and tok(shape, c)]
        best = max(peers) if peers else None
        mine, f32 = tok(shape, "tessera-bf16"), tok(shape, "tessera-f32")
        ratios[f"{shape}_best_peer"] = best[1] if best else None
        ratios[f"{shape}_bf16_vs_f32"] = round(mine / f32, 3) if mine and f32 else None
        ratios[f"{shape}_bf16_vs_best_peer"] = round(mine / best[0], 3) if mine and best else None
        ratios[f"{shape}_f32_vs_best_peer"] = round(f32 / best[0], 3) if f32 and best else None
        if ratios[f"{shape}_bf16_vs_f32"] is not None:
            bf16_vs_f32.append(ratios[f"{shape}_bf16_vs_f32"])
        if ratios[f"{shape}_bf16_vs_best_peer"] is not None:
            bf16_vs_peer.append(ratios[f"{shape}_bf16_vs_best_peer"])
        int8 = tok(shape, "tessera-int8")
        ratios[f"{shape}_int8_vs_bf16"] = round(int8 / mine, 3) if int8 and mine else None
        ratios[f"{shape}_int8_vs_best_peer"] = round(int8 / best[0], 3) if int8 and best else None
        if ratios[f"{shape}_int8_vs_bf16"] is not None:
            int8_vs_bf16.append(ratios[f"{shape}_int8_vs_bf16"])
    if not has_bf16_units:
        notes.append("this CPU has neither AVX512-BF16 nor AMX-BF16: tessera's bf16 widens to float32 sgemm, so no "
                     "bf16 ratio is claimed")
    has_int8_units = features["amx_int8"] or features["avx512_vnni"]
    if not has_int8_units:
        notes.append("this CPU has neither AMX-INT8 nor AVX512-VNNI: tessera's int8 GEMMs multiply in float64, so no "
                     "int8 ratio is claimed")
    final = {"bench": "lowp", "results": summary, **ratios,
             "bf16_vs_f32_min": min(bf16_vs_f32) if bf16_vs_f32 and has_bf16_units else None,
             "bf16_vs_best_peer_min": min(bf16_vs_peer) if bf16_vs_peer and has_bf16_units else None,
             "int8_vs_bf16_min": min(int8_vs_bf16) if int8_vs_bf16 and has_int8_units else None,
             "cpu_features": features, "rounds": args.rounds, "steps": args.steps,
             "threads": args.threads, "load_avg_before": [round(x, 2) for x in load_before],
             "load_avg_after": [round(x, 2) for x in os.getloadavg()], "commands": commands, "notes": notes}
    table = "\n".join(rows)
    print(table)
    for shape in shapes:
        print(f"{shape}: bf16/f32 {ratios[f'{shape}_bf16_vs_f32']}, bf16/best peer {ratios[f'{shape}_bf16_vs_best_peer']}"
              f" (best peer {ratios[f'{shape}_best_peer']}), int8/bf16 {ratios[f'{shape}_int8_vs_bf16']}, "
              f"int8/best peer {ratios[f'{shape}_int8_vs_best_peer']}")
    for n in notes:
        print(f"note: {n}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"# Low-precision CPU training: tessera bf16 and int8 vs f32 vs peers\n\nMachine: {features['model']}, "
                    f"{os.cpu_count()} CPUs, {platform.platform()}; CPU features "
                    f"{ {k: v for k, v in features.items() if k not in ('model',)} }\n\nCommand:\n\n"
                    f"    python3 bench/run_lowp_bench.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}\n\n"
                    f"{table}\n\n```json\n{json.dumps(final, indent=1)}\n```\n")
    print(json.dumps(final))


if __name__ == "__main__":
    main()
