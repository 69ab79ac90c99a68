# Copied from shared/peers/torch_gpt_cpu.py (a reference script written outside tessera).
# Changes from that copy, nothing else:
#   - added --dump-init NPZ: writes the initial parameters (named as model.named_parameters(),
#     float32) and the pre-generated batches (x, y as int32, shape (n, batch, seq)) to NPZ, so
#     bench/peers/jax_gpt_cpu.py --init-from NPZ starts from the same weights and data. It
#     runs before the first step and is not timed; without the flag the script is unchanged.
#   - added --autocast bf16: the forward (and so the backward's matmuls) runs under
#     torch.autocast("cpu", dtype=torch.bfloat16) with float32 parameters and optimizer, PyTorch's
#     CPU mixed precision (oneDNN bf16 GEMMs on AVX512-BF16/AMX); without the flag, unchanged.
# It needs no other change for torch 2: it already switches to F.scaled_dot_product_attention
# and supports --compile when torch >= 2.0.
"""torch_gpt_cpu.py - CPU training-throughput anchor: a standard pre-LayerNorm
GPT-2-style decoder trained in fp32 with PyTorch eager mode.

Model: token + learned position embeddings -> L x [x + attn(LN(x)); x + mlp(LN(x))]
-> final LN -> LM head weight-tied to the token embedding.  Attention is causal
multi-head self-attention (fused qkv Linear with bias, output projection with
bias); the MLP is Linear(d,4d) -> GELU(tanh approximation, as GPT-2) ->
Linear(4d,d).  Init: N(0, 0.02), residual output projections N(0, 0.02/sqrt(2L)),
biases 0, LayerNorm weight 1 (as GPT-2 / nanoGPT).

Optimizer: AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on all
2-D parameters (matmul weights and the embeddings), 0 on biases and LayerNorm;
gradient-norm clip 1.0.  No LR schedule (throughput measurement only).

Data: uniform random token ids by default, or --data PATH to train on the
bytes of a file (byte-level tokens, needs --vocab >= 256).  Batches are
pre-generated so data loading is not timed.

Timing: one "step" = forward + cross-entropy loss + backward + grad clip +
AdamW step + zero_grad.  The first --warmup steps are not timed; the rest are
timed one by one.  tokens_per_s = batch*seq / median step time.

FLOPs convention (PaLM appendix B / nanoGPT estimate_mfu):
    model_flops_per_token = 6*N + 12*L*T*d
  N = every trainable parameter EXCEPT the position embedding table
      (the token-embedding table is counted once: it is the tied LM-head
      weight, a real vocab x d matmul; LayerNorm and bias params are included
      even though they do no matmul - they are <1% of N here).
  12*L*T*d = attention scores QK^T and the weighted sum AV, 2*2*T*d flops per
      token per layer forward, x3 for forward+backward, counting the full TxT
      matrix (causal masking is not credited as a saving).
  achieved_gflops = model_flops_per_token * tokens_per_s / 1e9.
This counts "useful model" flops only: no recompute, no softmax/LN/GELU/Adam
flops.

Example:
  /usr/bin/python3 torch_gpt_cpu.py --vocab 256 --layers 4 --heads 4 --dim 256 \
      --seq 256 --batch 8 --steps 20 --warmup 3 --threads 2
The last line printed is a JSON object with the results.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--dim", type=int, default=256)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--steps", type=int, default=20, help="timed steps")
ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--data", default="random", help="'random' or a file path (byte tokens)")
ap.add_argument("--compile", action="store_true", help="use torch.compile (torch >= 2.0)")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--autocast", default="off", choices=["off", "bf16"],
                help="bf16: forward under torch.autocast('cpu', dtype=torch.bfloat16)")
ap.add_argument("--dump-init", default=None, metavar="NPZ",
                help="write initial params and the batches to NPZ (for jax_gpt_cpu.py --init-from)")
args = ap.parse_args()

# Thread counts must be in the environment before torch loads: Debian's torch
# does fp32 GEMM through OpenBLAS (libblas.so.3), which sizes its own thread
# pool from OPENBLAS_NUM_THREADS at load time; torch.set_num_threads alone
# does not control it.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))  # an explicit env setting wins

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_out = nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool).triu_(1)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, layers, heads, dim, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # weight-tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_batches(n):
    """n (input, target) pairs of shape (batch, seq)."""
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(args.seed + 1)
    if args.data == "random":
        stream = torch.randint(0, args.vocab, (n * B * (T + 1),), generator=g)
        chunks = stream.view(n, B, T + 1)
    else:
        assert args.vocab >= 256, "byte-level data needs --vocab >= 256"
        data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
        assert data.numel() > T + 1, "data file shorter than one sequence"
        starts = torch.randint(0, data.numel() - T - 1, (n, B), generator=g)
        chunks = torch.stack([torch.stack([data[s:s + T + 1] for s in row.tolist()]) for row in starts])
    return [(c[:, :-1].contiguous(), c[:, 1:].contiguous()) for c in chunks]


def main():
    model = GPT(args.vocab, args.layers, args.heads, args.dim, args.seq)
    params = sum(p.numel() for p in model.parameters())
    n_flop_params = params - model.wpe.weight.numel()
    flops_per_token = 6 * n_flop_params + 12 * args.layers * args.seq * args.dim

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8)

    step_fn_model = model
    if args.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch {torch.__version__} has no torch.compile (needs >= 2.0)")
        step_fn_model = torch.compile(model)

    batches = make_batches(args.warmup + args.steps)
    if args.dump_init:
        import numpy as np
        arrays = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
        arrays["batches.x"] = torch.stack([x for x, _ in batches]).numpy().astype(np.int32)
        arrays["batches.y"] = torch.stack([y for _, y in batches]).numpy().astype(np.int32)
        np.savez(args.dump_init, **arrays)
    times, fwd_ms, bwd_ms, opt_ms, losses = [], [], [], [], []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss = step_fn_model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        losses.append(loss.item())
        if i >= args.warmup:
            times.append(t3 - t0)
            fwd_ms.append(1e3 * (t1 - t0))
            bwd_ms.append(1e3 * (t2 - t1))
            opt_ms.append(1e3 * (t3 - t2))
        print(f"step {i:3d} loss {losses[-1]:.4f} {1e3 * (t3 - t0):8.1f} ms"
              f"{'  (warmup)' if i < args.warmup else ''}", file=sys.stderr, flush=True)

    med = statistics.median(times)
    tok_s = args.batch * args.seq / med
    print(json.dumps({
        "tokens_per_s": round(tok_s, 1),
        "step_ms_median": round(1e3 * med, 2),
        "step_ms_min": round(1e3 * min(times), 2),
        "step_ms_max": round(1e3 * max(times), 2),
        "fwd_ms_median": round(statistics.median(fwd_ms), 2),
        "bwd_ms_median": round(statistics.median(bwd_ms), 2),
        "clip_opt_ms_median": round(statistics.median(opt_ms), 2),
        "model_flops_per_token": flops_per_token,
        "achieved_gflops": round(flops_per_token * tok_s / 1e9, 2),
        "params": params,
        "params_for_flops": n_flop_params,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "config": {k: v for k, v in vars(args).items()},
        "torch": torch.__version__,
        "python": sys.executable,
        "attention": "F.scaled_dot_product_attention" if HAVE_SDPA else "explicit masked softmax",
    }))


if __name__ == "__main__":
    main()
