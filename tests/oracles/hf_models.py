"""Hugging Face transformers as the oracle of tessera's HF import (src/interop/).

Builds tiny GPT2LMHeadModel, LlamaForCausalLM and MixtralForCausalLM models from configs (nothing comes
from the hub), gives every parameter random values (norm scales and biases too, so a
mistaken mapping shows), and saves them with save_pretrained into the committed
fixtures tests/interop/fixtures/hf_*/ -- only when a fixture is missing or
HF_ORACLE_REBUILD=1, so the golden always describes the committed files. Then it loads
each fixture back with from_pretrained and writes the float32 logits of fixed tokens
to the golden (argv[1]); tests/interop/test_hf_import.cpp compares tessera's logits of
the same fixtures against them.

    tests/oracles/run_oracle.sh hf_models
"""

import json
import os
import shutil
import sys

import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MixtralConfig,
                          MixtralForCausalLM)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "interop", "fixtures")
VOCAB = 96
TOKENS = [[5, 17, 94, 0, 33, 61, 2], [88, 3, 3, 41, 70, 12, 95]]  # batch 2, length 7


def gpt2_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=None,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=95, eos_token_id=95)


def llama_config(tied, **overrides):
    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=tied, hidden_act="silu", attention_bias=False,
                  mlp_bias=False, bos_token_id=1, eos_token_id=2)
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


# Llama 3.1's RoPE scaling with Llama 3.1's factors, on a pretraining context so short that
# head_dim 8 at theta 100 has one frequency in each band: wavelengths 2 pi / theta^(-2i/8)
# = 6.3 (< 32/4: unchanged), 19.9 (between: interpolated), 62.8 and 199 (> 32/1: / 8).
LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def llama31_config(rope_parameters=None):
    return llama_config(tied=False, max_position_embeddings=64, rope_parameters=rope_parameters or LLAMA31_ROPE)


def mixtral_config():
    # 4 experts, 2 per token (dropless, as transformers computes it); saved in the hub's
    # original layout (block_sparse_moe.experts.N.w1/w2/w3), save_pretrained's default.
    return MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu", num_local_experts=4,
                         num_experts_per_tok=2, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
                         sliding_window=None, bos_token_id=1, eos_token_id=2)


def randomize(model, seed):
    """Every parameter random: weights ~ N(0, 0.2), norm scales ~ 1 + N(0, 0.2), biases ~ N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "ln" in name or "norm" in name:
                p.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.2 * noise)
    return model.eval()


def build(name):
    """(model class, model with random weights, save_pretrained keyword arguments)."""
    if name == "hf_gpt2":
        return randomize(GPT2LMHeadModel(gpt2_config()), 1), {}
    if name == "hf_llama":
        return randomize(LlamaForCausalLM(llama_config(tied=False)), 2), {}
    if name == "hf_llama_sharded":  # the same weights as hf_llama, in shards of at most 20 KB
        return randomize(LlamaForCausalLM(llama_config(tied=False)), 2), {"max_shard_size": "20KB"}
    if name == "hf_llama_tied":
        return randomize(LlamaForCausalLM(llama_config(tied=True)), 3), {}
    if name == "hf_llama31":
        return randomize(LlamaForCausalLM(llama31_config()), 4), {}
    if name == "hf_mixtral":
        return randomize(MixtralForCausalLM(mixtral_config()), 5), {}
    raise ValueError(name)


def ensure_fixture(name):
    path = os.path.join(FIXTURES, name)
    if os.path.isdir(path) and os.environ.get("HF_ORACLE_REBUILD") != "1":
        return path
    shutil.rmtree(path, ignore_errors=True)
    model, kwargs = build(name)
    model.save_pretrained(path, **kwargs)
    # Not needed by the import; keeps the fixtures to what a model directory must hold.
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(path, extra)):
            os.remove(os.path.join(path, extra))
    print(f"[hf_models] wrote fixture {os.path.relpath(path, ROOT)}")
    return path


def logits_of(path, cls):
    model = cls.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor(TOKENS, dtype=torch.long)).logits
    assert out.dtype == torch.float32, out.dtype
    return out


def unscaled_logits_of(path):
    """The same weights with plain RoPE at the same theta: how much the scaling changes the logits."""
    model = LlamaForCausalLM.from_pretrained(
        path, config=llama31_config({"rope_type": "default", "rope_theta": LLAMA31_ROPE["rope_theta"]}),
        attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor(TOKENS, dtype=torch.long)).logits


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hf_models.py GOLDEN_JSON")
    torch.set_num_threads(1)
    golden = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
              "tokens": TOKENS, "cases": []}
    for name, cls in (("hf_gpt2", GPT2LMHeadModel), ("hf_llama", LlamaForCausalLM),
                      ("hf_llama_sharded", LlamaForCausalLM), ("hf_llama_tied", LlamaForCausalLM),
                      ("hf_llama31", LlamaForCausalLM), ("hf_mixtral", MixtralForCausalLM)):
        path = ensure_fixture(name)
        logits = logits_of(path, cls)
        if name == "hf_llama_sharded":
            # The sharded copy must hold the same model; its logits are not stored twice.
            assert torch.equal(logits, logits_of(os.path.join(FIXTURES, "hf_llama"), cls)), "sharded != unsharded"
            continue
        if name == "hf_llama31":
            # The C++ tests compare at 5e-5: the scaling must move the logits far more than that.
            change = (logits - unscaled_logits_of(path)).abs().max().item()
            print(f"[hf_models] llama3 RoPE scaling changes hf_llama31's logits by up to {change:.3g}")
            assert change > 0.05, change
        golden["cases"].append({
            "name": name,
            "shape": list(logits.shape),
            # float32 values printed with 9 significant digits round-trip exactly.
            "logits": [float(f"{v:.9g}") for v in logits.flatten().tolist()],
        })
    with open(sys.argv[1], "w") as f:
        json.dump(golden, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
