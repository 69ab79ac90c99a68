"""gpt2_torch_gpu.py - GPU training-throughput peer: GPT-2 124M in PyTorch 2 on one GPU.

The model, optimizer and data are those of torch_gpt_cpu.py (read its docstring): pre-LN
GPT-2 with learned position embeddings, fused-qkv causal MHA with biases, tanh-GELU 4x MLP,
LM head tied to the token embedding; AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on the 2-D parameters only, global-norm gradient clip 1.0; uniform random tokens,
pre-generated on the GPU (no network, random weights). What differs is how it runs, the way
a tuned PyTorch 2 GPU training script does:

  * shape: GPT-2 124M (vocab 50257 unpadded, 12 layers, 12 heads, dim 768, seq 1024),
    --batch sequences per step;
  * torch.autocast(bfloat16) around forward + loss (parameters, gradients and the optimizer
    state stay float32), TF32 matmuls allowed for what autocast leaves in float32;
  * attention: F.scaled_dot_product_attention(is_causal=True) restricted to the
    FlashAttention backend (--sdpa-backend; 'auto' lets PyTorch choose);
  * torch.compile(model) (--no-compile for eager); AdamW(fused=True).

Timing: one step = forward + loss + backward + clip + AdamW step + zero_grad, then
torch.cuda.synchronize(). The first --warmup steps (compilation, autotuning) are not
timed; tokens_per_s = batch*seq / median timed step.

FLOPs convention (llm.c, train_gpt2.cu's estimate_mfu; NOT the CPU peers' PaLM one):
    model_flops_per_token = 6*N + 6*L*T*d
  N = every parameter, position table included (124,439,808 for this shape; llm.c's own
      count is larger because it pads the vocabulary to 50304); 6*L*T*d is the attention
      QK^T and AV with the causal half credited (the CPU peers' 12*L*T*d counts the full
      T x T matrix).
  mfu = model_flops_per_token * tokens_per_s / --peak-flops (989e12: H100 SXM dense bf16).

--config tiny shrinks everything (and allows the CPU) to check that the script runs.
The last line printed is a JSON object (keys of torch_gpt_cpu.py's plus mfu and friends).
"""
import argparse
import json
import math
import statistics
import sys
import time

CONFIGS = {
    "gpt2-124m": dict(vocab=50257, layers=12, heads=12, dim=768, seq=1024, batch=16, steps=20, warmup=5),
    "tiny": dict(vocab=256, layers=2, heads=2, dim=64, seq=64, batch=2, steps=3, warmup=1),
}

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--config", choices=sorted(CONFIGS), default="gpt2-124m",
                help="model shape and defaults; 'tiny' is a smoke test that may run on the CPU")
for key in ("vocab", "layers", "heads", "dim", "seq", "batch", "steps", "warmup"):
    ap.add_argument(f"--{key}", type=int, default=None, help=f"override the config's {key}")
ap.add_argument("--no-compile", action="store_true", help="eager mode instead of torch.compile")
ap.add_argument("--sdpa-backend", choices=("flash", "cudnn", "efficient", "math", "auto"), default="flash",
                help="F.scaled_dot_product_attention backend on the GPU (default flash)")
ap.add_argument("--peak-flops", type=float, default=989e12, help="peak dense bf16 FLOP/s for MFU (H100 SXM)")
ap.add_argument("--device", default=None, help="cuda (default) or cpu (only with --config tiny)")
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
cfg = dict(CONFIGS[args.config])
for key in cfg:
    if getattr(args, key, None) is not None:
        cfg[key] = getattr(args, key)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
if device == "cpu" and args.config != "tiny":
    sys.exit("gpt2_torch_gpu.py: no CUDA device (torch.cuda.is_available() is False); "
             "use --config tiny --device cpu for a smoke test")
on_gpu = device.startswith("cuda")
torch.manual_seed(args.seed)
if on_gpu:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


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
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # weight-tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def sdpa_context():
    """The attention backend restriction for the whole step (forward and backward)."""
    import contextlib
    if not on_gpu or args.sdpa_backend == "auto":
        return contextlib.nullcontext(), "auto"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[args.sdpa_backend]
    return sdpa_kernel(backend), args.sdpa_backend


def main():
    B, T, L, d = cfg["batch"], cfg["seq"], cfg["layers"], cfg["dim"]
    model = GPT(cfg["vocab"], L, cfg["heads"], d, T).to(device)
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 6 * L * T * d  # llm.c's convention (see the docstring)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=on_gpu)
    step_model = model if args.no_compile else torch.compile(model)

    n = cfg["warmup"] + cfg["steps"]
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    tokens = torch.randint(0, cfg["vocab"], (n, B, T + 1), generator=g, device=device)
    batches = [(c[:, :-1].contiguous(), c[:, 1:].contiguous()) for c in tokens]

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    context, backend = sdpa_context()
    times, losses = [], []
    sync()
    with context:
        for i, (x, y) in enumerate(batches):
            t0 = time.perf_counter()
            with torch.autocast(device_type="cuda" if on_gpu else "cpu", dtype=torch.bfloat16):
                loss = step_model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())  # waits for the step
            sync()
            t1 = time.perf_counter()
            if i >= cfg["warmup"]:
                times.append(t1 - t0)
            print(f"step {i:3d} loss {losses[-1]:.4f} {1e3 * (t1 - t0):9.1f} ms"
                  f"{'  (warmup)' if i < cfg['warmup'] else ''}", file=sys.stderr, flush=True)

    med = statistics.median(times)
    tok_s = B * T / med
    print(json.dumps({
        "tokens_per_s": round(tok_s, 1),
        "mfu": round(flops_per_token * tok_s / args.peak_flops, 4),
        "achieved_tflops": round(flops_per_token * tok_s / 1e12, 2),
        "step_ms_median": round(1e3 * med, 2),
        "step_ms_min": round(1e3 * min(times), 2),
        "step_ms_max": round(1e3 * max(times), 2),
        "model_flops_per_token": flops_per_token,
        "flops_convention": "llm.c: 6*N + 6*L*T*d, N = all parameters (position table included)",
        "peak_flops": args.peak_flops,
        "params": params,
        "params_for_flops": params,
        "batch": B,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "config": {"name": args.config, **cfg, "compile": not args.no_compile, "sdpa_backend": backend,
                   "seed": args.seed},
        "precision": "bf16 autocast, fp32 params/grads/AdamW state (fused AdamW)" if on_gpu
                     else "bf16 autocast (CPU smoke test)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "python": sys.executable,
        "attention": f"F.scaled_dot_product_attention(is_causal=True), backend {backend}",
    }))


if __name__ == "__main__":
    main()
