#!/usr/bin/env python3
"""The planner against MaxText's published runs: for every run of
bench/plan/published_runs.json, `tessera plan --json` predicts the step in MaxText's
layout (--mesh), and the table shows predicted against published throughput.

    python3 bench/plan/compare_published.py [--tessera build/bin/tessera]
        [--runs bench/plan/published_runs.json] [--only v6e] [--search]

MFU depends on how model FLOPs are counted, and tessera and MaxText count differently:
tessera 6N + 12 L s d (N with the input embedding, attention not halved); MaxText before
its PR #1988 3 x 2 x (matmul weights, the unembedding but not the input embedding) +
3 x 4 L s H hd (not halved). So the error is taken on tokens/s per chip, which no count
changes: error = predicted / published - 1, the same number as the MFU error with both
MFUs in one count. The table shows both MFUs in both counts.

--search also plans each run with the layout search (--chips N instead of --mesh) and
shows which layout it chose and that prediction's error.

The JSON last line has mfu_error_max (the largest |error| over the runs the planner
could cost), the same over the runs whose figures did not set the catalog
(mfu_error_max_noncircular), and every run's error.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BAR = 0.20  # the bar: predicted MFU within +-20% relative of the published


def maxtext_flops_per_token(m, seq):
    """MaxText's calculate_tflops_training_per_device per token, before PR #1988
    (attention not halved for the causal mask): what its published TFLOP/s count."""
    d, hd = m["dim"], m["head_dim"]
    mlp = (3 if m["mlp"] == "gated" else 2) * 2 * d * m["mlp_dim"]
    qkv = 2 * d * (m["heads"] + 2 * m["kv_heads"]) * hd
    out = 2 * d * m["heads"] * hd
    unembed = 2 * d * m["vocab"]
    attention = 4 * seq * m["heads"] * hd
    return 3 * (m["layers"] * (mlp + qkv + out) + unembed) + 3 * m["layers"] * attention


def published_tokens_per_chip(run, m, peak):
    """Tokens/s per chip: as logged where the source gives it, else from TFLOP/s or MFU
    through MaxText's own FLOP count."""
    p = run["published"]
    if "tokens_per_s_per_chip" in p:
        return p["tokens_per_s_per_chip"]
    fpt = maxtext_flops_per_token(m, run["seq"])
    if "tflops_per_chip" in p:
        return p["tflops_per_chip"] * 1e12 / fpt
    return p["mfu"] * peak / fpt


def plan_command(tessera, run, model, planner_set, layout_args, catalog=None):
    cmd = [tessera, "plan", "--model", model["preset"], "--batch", str(run["per_chip_batch"] * run["chips"]),
           "--seq", str(run["seq"]), "--set", "model.compute_dtype=bfloat16", "--set", f"model.remat={run['remat']}"]
    for s in model.get("set", []) + run.get("set", []) + planner_set:
        cmd += ["--set", s]
    if catalog:
        cmd += ["--catalog", catalog]
    return cmd + ["--accelerators", run["accelerator"]] + layout_args + ["--json"]


def plan(cmd, timeout):
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"found": False, "reason": f"no answer in {timeout:.0f} s"}, time.time() - t0
    if r.returncode != 0:
        return {"found": False, "reason": (r.stderr or r.stdout).strip().splitlines()[-1:]}, time.time() - t0
    row = json.loads(r.stdout.strip().splitlines()[-1])["strong_scaling"][0]
    return row, time.time() - t0


def shell(cmd):
    return " ".join(a if all(c.isalnum() or c in "-_=.,/" for c in a) else f"'{a}'" for a in cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/bin/tessera")
    ap.add_argument("--runs", default=os.path.join(ROOT, "bench/plan/published_runs.json"))
    ap.add_argument("--catalog", default=os.path.join(ROOT, "configs/accelerators.toml"),
                    help="the catalog tessera plan reads (--catalog) and the peaks come from")
    ap.add_argument("--only", default="", help="runs whose id contains this")
    ap.add_argument("--search", action="store_true", help="also plan with the layout search (--chips N)")
    ap.add_argument("--optimizer", default="",
                    help="plan with this optimizer instead of the file's planner_set (adamw needs ~8 bytes of host "
                         "memory per parameter: see planner_set_why)")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()

    spec = json.load(open(args.runs))
    with open(args.catalog, "rb") as f:
        catalog = tomllib.load(f)
    runs = [r for r in spec["runs"] if args.only in r["id"]]
    planner_set = [f"optimizer.name={args.optimizer}"] if args.optimizer else spec.get("planner_set", [])

    rows = []
    for i, run in enumerate(runs):
        m = spec["models"][run["model"]]
        peak = catalog[run["accelerator"]]["peak_flops"]
        pub_tps = published_tokens_per_chip(run, m, peak)
        mt_fpt = maxtext_flops_per_token(m, run["seq"])
        p = run["published"]
        if "mfu" in p:
            pub_mfu_mt = p["mfu"]
        elif "tflops_per_chip" in p:
            pub_mfu_mt = p["tflops_per_chip"] * 1e12 / peak
        else:
            pub_mfu_mt = pub_tps * mt_fpt / peak
        tw = p.get("total_weights")  # tokens a step in MaxText's log line: catches a wrong batch
        if tw is not None and tw != run["chips"] * run["per_chip_batch"] * run["seq"]:
            raise SystemExit(f"{run['id']}: the log's total_weights {tw} is not chips x per_chip_batch x seq")
        cmd = plan_command(args.tessera, run, m, planner_set, ["--mesh", run["mesh"]], os.path.relpath(args.catalog, ROOT))
        sys.stderr.write(f"[{i + 1}/{len(runs)}] {run['id']}: {shell(cmd)}\n")
        pred, secs = plan(cmd, args.timeout)
        row = {"id": run["id"], "circular": run["circular"], "published_mfu_maxtext": pub_mfu_mt,
               "published_tokens_per_s_per_chip": pub_tps, "command": shell(cmd), "plan_seconds": secs}
        if pred.get("found"):
            chips = run["chips"]
            pred_tps = pred["tokens_per_second"] / chips
            tessera_fpt = pred["mfu"] * peak * chips / pred["tokens_per_second"]
            row.update({
                "mesh": pred["mesh"], "step_seconds": pred["step_seconds"], "mfu": pred["mfu"],
                "mfu_maxtext": pred_tps * mt_fpt / peak, "published_mfu_tessera": pub_tps * tessera_fpt / peak,
                "tokens_per_s_per_chip": pred_tps, "error": pred_tps / pub_tps - 1,
                "compute_seconds": pred["compute_seconds"], "collective_seconds": pred["collective_seconds"],
                "exposed_collective_seconds": pred["exposed_collective_seconds"],
                # If no collective overlapped the compute: a bound on what overlap is worth.
                "error_no_overlap": pred_tps * pred["step_seconds"] /
                (pred["compute_seconds"] + pred["collective_seconds"]) / pub_tps - 1,
                "memory_gb": pred["memory"]["peak"] / 1e9, "fits": pred["memory"]["fits"],
            })
        else:
            row["reason"] = pred.get("reason")
        if args.search:
            cmd_s = plan_command(args.tessera, run, m, planner_set, ["--chips", str(run["chips"])], os.path.relpath(args.catalog, ROOT))
            sys.stderr.write(f"    search: {shell(cmd_s)}\n")
            s, _ = plan(cmd_s, args.timeout)
            if s.get("found"):
                row["search_mesh"] = s["mesh"]
                row["search_error"] = s["tokens_per_second"] / run["chips"] / pub_tps - 1
                row["search_fits"] = s["memory"]["fits"]
                sys.stderr.write(f"    search: {s['mesh']} {row['search_error']:+.3f}"
                                 f"{'' if s['memory']['fits'] else ' (nothing fits: the least memory)'}\n")
            else:
                row["search_mesh"] = "none found"
                row["search_reason"] = s.get("reason")
                sys.stderr.write(f"    search found nothing: {s.get('reason')}\n")
        rows.append(row)
        sys.stderr.write(f"    {row.get('error', float('nan')):+.3f} ({secs:.0f} s)\n")

    print(f"{'run':<32} {'pub MFU':>8} {'pub MFU':>8} {'pred MFU':>8} {'pred MFU':>8} {'error':>7}  {'mesh':<19} "
          f"{'step':>8} {'pub step':>8} {'coll':>6} {'no-ovl':>7} {'mem GB':>9}" + ("  search" if args.search else ""))
    print(f"{'':<32} {'MaxText':>8} {'tessera':>8} {'tessera':>8} {'MaxText':>8}")
    for r in rows:
        tag = " *" if r["circular"] else ""
        if "error" not in r:
            print(f"{r['id'] + tag:<32} {100 * r['published_mfu_maxtext']:>7.1f}%  planner: {r.get('reason')}")
            continue
        fit = "" if r["fits"] else " NO"
        pub_step = r["step_seconds"] * (1 + r["error"])
        line = (f"{r['id'] + tag:<32} {100 * r['published_mfu_maxtext']:>7.1f}% {100 * r['published_mfu_tessera']:>7.1f}% "
                f"{100 * r['mfu']:>7.1f}% {100 * r['mfu_maxtext']:>7.1f}% {100 * r['error']:>+6.1f}%  {r['mesh']:<19} "
                f"{r['step_seconds']:>7.2f}s {pub_step:>7.2f}s {r['collective_seconds'] / r['compute_seconds']:>6.2f} "
                f"{100 * r['error_no_overlap']:>+6.1f}% {r['memory_gb']:>6.0f}{fit:<3}")
        if args.search:
            se = r.get("search_error")
            line += f"  {r['search_mesh']} {'' if se is None else f'{100 * se:+.1f}%'}"
            line += "" if r.get("search_fits", True) else " NO"
        print(line)
    print("* circular: the run's figure set the catalog's gemm_efficiency for that accelerator")
    print("error: predicted / published tokens/s per chip - 1 (= the MFU error, both MFUs in one count); coll: "
          "collective / compute seconds; no-ovl: the error if no collective overlapped; mem: predicted peak per chip, "
          "NO = over the chip's memory (the published runs fit)")

    found = [r for r in rows if "error" in r]
    noncirc = [r for r in found if not r["circular"]]
    summary = {
        "mfu_error_max": max((abs(r["error"]) for r in found), default=None),
        "mfu_error_max_noncircular": max((abs(r["error"]) for r in noncirc), default=None),
        "within_bar": sum(abs(r["error"]) <= BAR for r in found),
        "runs_costed": len(found),
        "runs": len(rows),
        "bar": BAR,
        "errors": {r["id"]: round(r["error"], 4) for r in found},
        "errors_no_overlap": {r["id"]: round(r["error_no_overlap"], 4) for r in found},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
