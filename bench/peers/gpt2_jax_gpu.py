"""gpt2_jax_gpu.py - GPU training-throughput peer: GPT-2 124M in JAX on one GPU.

The model, optimizer, data, timing, FLOPs convention and JSON line of gpt2_torch_gpu.py
(read its docstring), written the way a tuned JAX GPU training script is:

  * parameters (PyTorch's names and layouts, as jax_gpt_cpu.py) and the AdamW state in
    float32; the forward and backward compute in bfloat16 (parameters cast inside the
    loss, so their gradients come back float32); LayerNorm statistics, softmax and the
    loss in float32;
  * attention: jax.nn.dot_product_attention(is_causal=True) with implementation='cudnn'
    (cuDNN's fused flash attention) when this JAX and GPU support it, else 'xla'
    (--attention to choose);
  * one jax.jit step (forward + loss + backward + clip + AdamW) with donated parameters
    and optimizer state; optax when it is installed, else the same AdamW written out
    (decoupled weight decay 0.1 on the 2-D parameters, global-norm clip 1.0).

Timing: one step = the jitted call, then jax.block_until_ready on the parameters and the
loss. The first --warmup steps (compilation) are not timed; tokens_per_s = batch*seq /
median timed step. MFU as gpt2_torch_gpu.py: llm.c's 6*N + 6*L*T*d over --peak-flops.

--config tiny shrinks everything (and runs on the CPU) to check that the script runs.
The last line printed is a JSON object.
"""
import argparse
import importlib.metadata
import json
import statistics
import sys
import time

CONFIGS = {
    "gpt2-124m": dict(vocab=50257, layers=12, heads=12, dim=768, seq=1024, batch=16, steps=20, warmup=3),
    "tiny": dict(vocab=256, layers=2, heads=2, dim=64, seq=64, batch=2, steps=3, warmup=1),
}

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--config", choices=sorted(CONFIGS), default="gpt2-124m",
                help="model shape and defaults; 'tiny' is a smoke test that may run on the CPU")
for key in ("vocab", "layers", "heads", "dim", "seq", "batch", "steps", "warmup"):
    ap.add_argument(f"--{key}", type=int, default=None, help=f"override the config's {key}")
ap.add_argument("--attention", choices=("auto", "cudnn", "xla"), default="auto",
                help="jax.nn.dot_product_attention implementation (auto: cudnn if it works here, else xla)")
ap.add_argument("--no-optax", action="store_true", help="use the hand-written AdamW even if optax is installed")
ap.add_argument("--peak-flops", type=float, default=989e12, help="peak dense bf16 FLOP/s for MFU (H100 SXM)")
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()
cfg = dict(CONFIGS[args.config])
for key in cfg:
    if getattr(args, key, None) is not None:
        cfg[key] = getattr(args, key)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

try:
    import optax  # noqa: E402
except ImportError:
    optax = None
if args.no_optax:
    optax = None

BF16, F32 = jnp.bfloat16, jnp.float32
LN_EPS = 1e-5
LR, B1, B2, EPS, WD, CLIP = 3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0

platform = jax.devices()[0].platform
if platform != "gpu" and args.config != "tiny":
    sys.exit(f"gpt2_jax_gpu.py: JAX sees no GPU ({jax.devices()}); use --config tiny for a smoke test")


def param_shapes(vocab, layers, dim, seq):
    """Name -> shape, in torch's named_parameters() order and layout (Linear weight is (out, in))."""
    shapes = {"wte.weight": (vocab, dim), "wpe.weight": (seq, dim)}
    for i in range(layers):
        p = f"blocks.{i}."
        shapes.update({
            p + "ln1.weight": (dim,), p + "ln1.bias": (dim,),
            p + "qkv.weight": (3 * dim, dim), p + "qkv.bias": (3 * dim,),
            p + "proj.weight": (dim, dim), p + "proj.bias": (dim,),
            p + "ln2.weight": (dim,), p + "ln2.bias": (dim,),
            p + "fc.weight": (4 * dim, dim), p + "fc.bias": (4 * dim,),
            p + "fc_out.weight": (dim, 4 * dim), p + "fc_out.bias": (dim,),
        })
    shapes.update({"ln_f.weight": (dim,), "ln_f.bias": (dim,)})
    return shapes


def init_params(key, shapes, layers):
    """GPT-2 init: N(0, 0.02); residual projections N(0, 0.02/sqrt(2L)); biases 0; LayerNorm weights 1."""
    params = {}
    keys = jax.random.split(key, len(shapes))
    for k, (name, shape) in zip(keys, shapes.items()):
        if name.endswith("bias"):
            params[name] = jnp.zeros(shape, F32)
        elif len(shape) >= 2:
            std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
            params[name] = std * jax.random.normal(k, shape, F32)
        else:
            params[name] = jnp.ones(shape, F32)
    return params


def layer_norm(x, w, b):
    """Statistics in float32, result in the compute dtype."""
    x32 = x.astype(F32)
    mu = x32.mean(-1, keepdims=True)
    var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + LN_EPS) * w.astype(F32) + b.astype(F32)).astype(x.dtype)


def linear(x, p, name):
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def pick_attention():
    """'cudnn' when a small causal bf16 call compiles and runs here, else 'xla'."""
    if args.attention != "auto":
        return args.attention
    if platform != "gpu" or not hasattr(jax.nn, "dot_product_attention"):
        return "xla"
    try:
        q = jnp.zeros((1, 128, 2, 64), BF16)
        f = jax.jit(lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation="cudnn"))
        jax.block_until_ready(f(q))
        jax.block_until_ready(jax.jit(jax.grad(lambda q: f(q).astype(F32).sum()))(q))
        return "cudnn"
    except Exception as e:  # noqa: BLE001 - any failure means: not available here
        print(f"gpt2_jax_gpu.py: cuDNN attention unavailable ({type(e).__name__}: {str(e)[:200]}); using xla",
              file=sys.stderr)
        return "xla"


ATTENTION = pick_attention()


def attention(x, p, prefix, heads):
    B, T, C = x.shape
    hd = C // heads
    q, k, v = jnp.split(linear(x, p, prefix + "qkv"), 3, axis=-1)
    q, k, v = (t.reshape(B, T, heads, hd) for t in (q, k, v))  # (B, T, N, H): dot_product_attention's layout
    if hasattr(jax.nn, "dot_product_attention"):
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=ATTENTION)
    else:  # older JAX: the same math written out
        s = jnp.einsum("btnh,bsnh->bnts", q, k).astype(F32) / hd ** 0.5
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        y = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-1).astype(q.dtype), v)
    return linear(y.reshape(B, T, C), p, prefix + "proj")


def loss_fn(params, idx, targets):
    p = jax.tree_util.tree_map(lambda a: a.astype(BF16), params)  # bf16 compute, fp32 master weights
    T = idx.shape[1]
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    for i in range(cfg["layers"]):
        pre = f"blocks.{i}."
        x = x + attention(layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"]), p, pre, cfg["heads"])
        h = linear(layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"]), p, pre + "fc")
        x = x + linear(jax.nn.gelu(h, approximate=True), p, pre + "fc_out")
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = (x @ p["wte.weight"].T).astype(F32)  # weight-tied LM head; the loss in float32
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (logz - picked).mean()


def decay_mask(params):
    return {k: v.ndim >= 2 for k, v in params.items()}


def make_optimizer():
    """(init, update): optax's chain, or the same AdamW written out."""
    if optax is not None:
        tx = optax.chain(optax.clip_by_global_norm(CLIP),
                         optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD, mask=decay_mask))

        def update(grads, state, params):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return tx.init, update, f"optax {optax.__version__}"

    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return {"m": zeros, "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)}

    def update(grads, state, params):
        norm = jnp.sqrt(sum(jnp.sum(g.astype(F32) ** 2) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.minimum(1.0, CLIP / jnp.maximum(norm, 1e-12))  # clip_by_global_norm
        t = state["t"] + 1
        m, v, new = {}, {}, {}
        for k, p in params.items():
            g = grads[k] * scale
            m[k] = B1 * state["m"][k] + (1 - B1) * g
            v[k] = B2 * state["v"][k] + (1 - B2) * g * g
            m_hat = m[k] / (1 - B1 ** t)
            v_hat = v[k] / (1 - B2 ** t)
            step = m_hat / (jnp.sqrt(v_hat) + EPS) + (WD * p if p.ndim >= 2 else 0.0)
            new[k] = p - LR * step
        return new, {"m": m, "v": v, "t": t}

    return init, update, "hand-written AdamW"


def main():
    B, T, L, d = cfg["batch"], cfg["seq"], cfg["layers"], cfg["dim"]
    shapes = param_shapes(cfg["vocab"], L, d, T)
    params = init_params(jax.random.PRNGKey(args.seed), shapes, L)
    n_params = sum(int(np.prod(s)) for s in shapes.values())
    flops_per_token = 6 * n_params + 6 * L * T * d  # llm.c's convention (gpt2_torch_gpu.py)

    opt_init, opt_update, opt_name = make_optimizer()
    opt_state = opt_init(params)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, opt_state = opt_update(grads, opt_state, params)
        return params, opt_state, loss

    step = jax.jit(train_step, donate_argnums=(0, 1))
    n = cfg["warmup"] + cfg["steps"]
    rng = np.random.default_rng(args.seed + 1)
    chunks = rng.integers(0, cfg["vocab"], (n, B, T + 1), dtype=np.int32)
    batches = [(jnp.asarray(c[:, :-1]), jnp.asarray(c[:, 1:])) for c in chunks]  # on the device, untimed
    jax.block_until_ready(batches)

    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        jax.block_until_ready((params, loss))
        t1 = time.perf_counter()
        losses.append(float(loss))
        if i >= cfg["warmup"]:
            times.append(t1 - t0)
        print(f"step {i:3d} loss {losses[-1]:.4f} {1e3 * (t1 - t0):9.1f} ms"
              f"{'  (warmup)' if i < cfg['warmup'] else ''}", file=sys.stderr, flush=True)

    med = statistics.median(times)
    tok_s = B * T / med
    dev = jax.devices()[0]
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
        "params": n_params,
        "params_for_flops": n_params,
        "batch": B,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "config": {"name": args.config, **cfg, "attention": ATTENTION, "optimizer": opt_name, "seed": args.seed},
        "precision": "bf16 compute, fp32 params/grads/AdamW state",
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "device": getattr(dev, "device_kind", str(dev)),
        "python": sys.executable,
        "attention": f"jax.nn.dot_product_attention(is_causal=True, implementation={ATTENTION!r})",
    }))


if __name__ == "__main__":
    main()
