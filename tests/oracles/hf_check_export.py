"""Loads a directory written by `tessera ckpt export-hf` with transformers and checks
its logits against tessera's (the live half of tests/interop/test_hf_export_live.cpp).

    hf_check_export.py EXPORT_DIR EXPECTED_JSON [EXPORT_DIR EXPECTED_JSON ...] [--tol 1e-4]

EXPECTED_JSON: {"tokens": [[...], ...], "logits": [flat float32 values], "shape": [B, T, V]}.
Exit status 0 when every logit of every model is within --tol (absolute) of tessera's,
1 otherwise. Several models go in one call (importing torch takes most of the time).
"""

import argparse
import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def check(export_dir, expected_json, tol):
    with open(expected_json) as f:
        expected = json.load(f)
    config = AutoConfig.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_pretrained(export_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(torch.tensor(expected["tokens"], dtype=torch.long)).logits.float()
    want = torch.tensor(expected["logits"], dtype=torch.float32).reshape(expected["shape"])
    if list(logits.shape) != list(want.shape):
        print(f"hf_check_export: transformers gives logits {list(logits.shape)}, tessera {list(want.shape)}")
        return 1
    err = (logits - want).abs().max().item()
    print(f"hf_check_export: {type(model).__name__} ({config.model_type}) from {export_dir}: "
          f"max |transformers - tessera| = {err:.3g} (tolerance {tol:g})")
    return 0 if err <= tol else 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pairs", nargs="+", help="EXPORT_DIR EXPECTED_JSON, repeated")
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    if len(args.pairs) % 2 != 0:
        parser.error("expected EXPORT_DIR EXPECTED_JSON pairs")
    torch.set_num_threads(1)
    failures = [check(d, j, args.tol) for d, j in zip(args.pairs[0::2], args.pairs[1::2])]
    return 1 if any(failures) else 0


if __name__ == "__main__":
    sys.exit(main())
