"""jax_gpt_cpu.py - the model and training step of torch_gpt_cpu.py, written with jax.jit.

Model, optimizer, data, timing and the FLOPs convention are those of torch_gpt_cpu.py (read its
docstring): pre-LN GPT-2, learned position embeddings, fused-qkv causal MHA with biases, tanh-GELU
4x MLP, LM head tied to the token embedding; AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on the 2-D parameters only, global-norm gradient clip 1.0 (optax). Parameters keep
PyTorch's names and layouts (Linear weight is (out, in)), so --init-from can load the NPZ written
by `torch_gpt_cpu.py --dump-init` and train from the same weights on the same batches.

One step = one jitted call (forward + loss + backward + clip + AdamW, buffers donated) plus the
host read of the loss. XLA fuses the phases, so the fwd/bwd/clip_opt split that the torch
script reports is null here.

Threads: XLA's CPU client sizes its compute thread pool from the process's CPU affinity mask,
not from any environment variable or XLA flag (`--xla_cpu_multi_thread_eigen=false` makes
it single-threaded; `intra_op_parallelism_threads` is a TensorFlow session option, not an XLA
flag). Run under `taskset -c 0,...,N-1` to get N threads; --threads only records the intent
and warns when the affinity mask disagrees.

The last line printed is a JSON object with the same keys as torch_gpt_cpu.py's.
"""
import argparse
import importlib.metadata
import json
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
ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one compiles)")
ap.add_argument("--threads", type=int, default=2, help="expected size of the CPU affinity mask (use taskset)")
ap.add_argument("--data", default="random", help="'random' or a file path (byte tokens)")
ap.add_argument("--compile", action="store_true", help="accepted for CLI parity; jax.jit always compiles")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"],
                help="bfloat16: the loss casts the float32 parameters to bf16 (mixed precision; optimizer in f32)")
ap.add_argument("--init-from", default=None, metavar="NPZ",
                help="initial params and batches from `torch_gpt_cpu.py --dump-init NPZ`")
args = ap.parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

LN_EPS = 1e-5  # torch.nn.LayerNorm default


def param_shapes(vocab, layers, dim, seq):
    """Name -> shape, in torch_gpt_cpu.py's named_parameters() order and layout."""
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
    """GPT-2 init as in torch_gpt_cpu.py: N(0, 0.02); residual projections N(0, 0.02/sqrt(2L)); biases 0; LN 1."""
    params = {}
    keys = jax.random.split(key, len(shapes))
    for k, (name, shape) in zip(keys, shapes.items()):
        if name.endswith("bias"):
            params[name] = jnp.zeros(shape, jnp.float32)
        elif len(shape) >= 2:
            std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
            params[name] = std * jax.random.normal(k, shape, jnp.float32)
        else:
            params[name] = jnp.ones(shape, jnp.float32)
    return params


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # biased variance, as torch
    return (x - mu) * jax.lax.rsqrt(var + LN_EPS) * w + b


def linear(x, params, name):
    return x @ params[name + ".weight"].T + params[name + ".bias"]


def attention(x, params, p, heads):
    B, T, C = x.shape
    hd = C // heads
    q, k, v = jnp.split(linear(x, params, p + "qkv"), 3, axis=-1)
    q, k, v = (t.reshape(B, T, heads, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = jnp.einsum("bhtd,bhsd->bhts", q, k) * (1.0 / hd ** 0.5)
    causal = jnp.tril(jnp.ones((T, T), bool))
    att = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    y = jnp.einsum("bhts,bhsd->bhtd", att, v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return linear(y, params, p + "proj")


def loss_fn(params, idx, targets):
    T = idx.shape[1]
    if args.compute_dtype == "bfloat16":  # f32 master weights, bf16 compute; the loss in f32
        params = {k: v.astype(jnp.bfloat16) for k, v in params.items()}
    x = params["wte.weight"][idx] + params["wpe.weight"][:T]
    for i in range(args.layers):
        p = f"blocks.{i}."
        x = x + attention(layer_norm(x, params[p + "ln1.weight"], params[p + "ln1.bias"]), params, p, args.heads)
        h = linear(layer_norm(x, params[p + "ln2.weight"], params[p + "ln2.bias"]), params, p + "fc")
        x = x + linear(jax.nn.gelu(h, approximate=True), params, p + "fc_out")
    x = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    logits = x @ params["wte.weight"].T  # weight-tied LM head
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (logz - picked).mean()


def make_optimizer():
    decay_mask = lambda params: {k: v.ndim >= 2 for k, v in params.items()}  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=decay_mask))


def make_batches(n):
    """n (input, target) pairs of shape (batch, seq), int32. Not the torch script's RNG: use --init-from for that."""
    B, T = args.batch, args.seq
    rng = np.random.default_rng(args.seed + 1)
    if args.data == "random":
        chunks = rng.integers(0, args.vocab, (n, B, T + 1), dtype=np.int32)
    else:
        assert args.vocab >= 256, "byte-level data needs --vocab >= 256"
        data = np.frombuffer(open(args.data, "rb").read(), dtype=np.uint8).astype(np.int32)
        assert data.size > T + 1, "data file shorter than one sequence"
        starts = rng.integers(0, data.size - T - 1, (n, B))
        chunks = np.stack([np.stack([data[s:s + T + 1] for s in row]) for row in starts])
    return [(c[:, :-1].copy(), c[:, 1:].copy()) for c in chunks]


def main():
    affinity = len(os.sched_getaffinity(0))
    if affinity != args.threads:
        print(f"warning: --threads {args.threads} but the CPU affinity mask has {affinity} CPUs; XLA sizes its "
              f"thread pool from the mask: run under taskset -c 0-{args.threads - 1}", file=sys.stderr)
    shapes = param_shapes(args.vocab, args.layers, args.dim, args.seq)
    n_steps = args.warmup + args.steps
    if args.init_from:
        npz = np.load(args.init_from)
        for name, shape in shapes.items():
            if npz[name].shape != shape:
                sys.exit(f"{args.init_from}: {name} has shape {npz[name].shape}, expected {shape}")
        params = {name: jnp.asarray(npz[name], jnp.float32) for name in shapes}
        xs, ys = npz["batches.x"], npz["batches.y"]
        if xs.shape[0] < n_steps or xs.shape[1:] != (args.batch, args.seq):
            sys.exit(f"{args.init_from}: batches.x has shape {xs.shape}, "
                     f"expected ({n_steps}+, {args.batch}, {args.seq})")
        batches = list(zip(xs[:n_steps], ys[:n_steps]))
    else:
        params = init_params(jax.random.PRNGKey(args.seed), shapes, args.layers)
        batches = make_batches(n_steps)

    params_count = sum(int(np.prod(s)) for s in shapes.values())
    n_flop_params = params_count - args.seq * args.dim  # all but the position table
    flops_per_token = 6 * n_flop_params + 12 * args.layers * args.seq * args.dim

    opt = make_optimizer()
    opt_state = opt.init(params)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(train_step, donate_argnums=(0, 1))
    batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in batches]  # device transfer is not timed
    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))  # waits for the step, like loss.item() in the torch script
        jax.block_until_ready(params)
        t3 = time.perf_counter()
        if i >= args.warmup:
            times.append(t3 - t0)
        print(f"step {i:3d} loss {losses[-1]:.4f} {1e3 * (t3 - t0):8.1f} ms"
              f"{'  (warmup)' if i < args.warmup else ''}", file=sys.stderr, flush=True)

    med = statistics.median(times)
    tok_s = args.batch * args.seq / med
    print(json.dumps({
        "tokens_per_s": round(tok_s, 1),
        "step_ms_median": round(1e3 * med, 2),
        "step_ms_min": round(1e3 * min(times), 2),
        "step_ms_max": round(1e3 * max(times), 2),
        "fwd_ms_median": None,
        "bwd_ms_median": None,
        "clip_opt_ms_median": None,
        "model_flops_per_token": flops_per_token,
        "achieved_gflops": round(flops_per_token * tok_s / 1e9, 2),
        "params": params_count,
        "params_for_flops": n_flop_params,
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "config": {k: v for k, v in vars(args).items()},
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "python": sys.executable,
        "attention": "explicit masked softmax (XLA)",
        "cpu_affinity": affinity,
    }))


if __name__ == "__main__":
    main()
