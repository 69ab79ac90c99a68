"""check_jax_vs_torch.py - jax_gpt_cpu.py trains the same model as torch_gpt_cpu.py.

Runs torch_gpt_cpu.py (eager; with --with-compile also torch.compile) for a few steps on a tiny
shape, dumping its initial weights and batches (--dump-init), then jax_gpt_cpu.py from that NPZ
(--init-from), and asserts that every step's loss agrees within --rtol (default 1e-4) relative.
The data are the bytes of a text file, so the loss falls by far more than the tolerance over the
run: a JAX step that did not train, or trained differently, would fail (checked too).

  bash bench/peers/setup_venv.sh
  ~/.cache/tessera-peers-venv/bin/python bench/peers/check_jax_vs_torch.py [--markdown OUT.md]

Exit status 0 when the curves agree; prints a markdown report (also to --markdown OUT.md).
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = os.path.join(HERE, "torch_gpt_cpu.py")
JAX = os.path.join(HERE, "jax_gpt_cpu.py")
STEP_RE = re.compile(r"^step\s+(\d+) loss (\S+)", re.M)

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--rtol", type=float, default=1e-4,
                help="relative tolerance; 1e-3 did not catch a beta2 = 0.999 (instead of 0.95) mistake in 10 steps")
ap.add_argument("--shape", default="--vocab 256 --layers 2 --heads 2 --dim 64 --seq 64 --batch 4",
                help="model flags passed to both scripts")
ap.add_argument("--data", default=TORCH, help="text file whose bytes are the training tokens")
ap.add_argument("--with-compile", action="store_true", help="also check torch.compile against eager")
ap.add_argument("--markdown", default=None, help="also write the report to this file")
args = ap.parse_args()


def run(cmd):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    losses = [float(m.group(2)) for m in STEP_RE.finditer(proc.stderr)]
    if len(losses) != args.steps:
        sys.exit(f"expected {args.steps} 'step N loss X' lines on stderr of {' '.join(cmd)}, got {len(losses)}")
    return losses


def main():
    common = args.shape.split() + ["--steps", str(args.steps), "--warmup", "0", "--threads", "2",
                                   "--data", args.data]
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "init.npz")
        curves = {"torch eager": run([sys.executable, TORCH, *common, "--dump-init", npz])}
        if args.with_compile:
            curves["torch.compile"] = run([sys.executable, TORCH, *common, "--compile"])
        curves["jax.jit"] = run([sys.executable, JAX, *common, "--init-from", npz])

    ref = curves["torch eager"]
    names = list(curves)
    lines = ["| step | " + " | ".join(names) + " | max rel diff vs torch eager |",
             "|---|" + "---|" * len(names) + "---|"]
    worst = 0.0
    for i in range(args.steps):
        rel = max(abs(curves[n][i] - ref[i]) / abs(ref[i]) for n in names)
        worst = max(worst, rel)
        lines.append(f"| {i} | " + " | ".join(f"{curves[n][i]:.4f}" for n in names) + f" | {rel:.2e} |")
    drop = ref[0] - min(ref)
    ok_agree = worst <= args.rtol
    ok_moves = drop > 10 * args.rtol * abs(ref[0])  # the curve must be informative at this tolerance
    verdict = "PASS" if ok_agree and ok_moves else "FAIL"
    import jax
    import torch
    report = "\n".join([
        f"# JAX vs torch loss curves ({datetime.date.today()})", "",
        f"Command: `{sys.executable} bench/peers/check_jax_vs_torch.py"
        f"{' --with-compile' if args.with_compile else ''}`", "",
        f"Shape: `{args.shape}`, {args.steps} steps, same initial weights and batches (torch_gpt_cpu.py "
        f"--dump-init -> jax_gpt_cpu.py --init-from), byte tokens of `{os.path.relpath(args.data)}`. "
        f"torch {torch.__version__}, jax {jax.__version__}. Losses as printed (4 decimals).", "",
        *lines, "",
        f"Worst relative difference {worst:.2e} (tolerance {args.rtol:g}); torch loss fell by {drop:.4f} "
        f"(must exceed {10 * args.rtol * abs(ref[0]):.4f} so the check can fail). **{verdict}**", ""])
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
