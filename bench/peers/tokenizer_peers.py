#!/usr/bin/env python3
"""Peers of bench/bench_tokenizer.cpp: tiktoken and Hugging Face tokenizers encoding and
decoding the same text with the same tokenizer (the gpt2_style fixture), run with the
oracle venv's python (.venv-oracles/, tests/oracles/requirements-tokenizers.txt).

  tokenizer_peers.py --file TEXT --fixture DIR [--runs 5] [--threads 4]

Prints one JSON line: {"tiktoken": {"encode_mb_s", "encode_parallel_mb_s", "decode_mb_s",
"tokens"}, "tokenizers": {...}, "versions": {...}}; MB/s are medians over --runs, after one
untimed warm-up run. encode: one call on the whole text (allowed_special="all");
parallel: the text cut into lines groups of ~64 KB, encode_batch with --threads threads.
"""
import argparse
import json
import os
import statistics
import time


def median_rate(fn, nbytes, runs):
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / 1e6 / statistics.median(times)


def chunks(text, size=1 << 16):
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def gpt2_byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    import tiktoken
    import tokenizers

    with open(args.file, "rb") as f:
        data = f.read()
    text = data.decode("utf-8", errors="replace")
    nbytes = len(text.encode("utf-8"))
    parts = chunks(text)
    with open(os.path.join(args.fixture, "tokenizer.json"), encoding="utf-8") as f:
        tok_json = json.load(f)
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    specials = {t["content"]: t["id"] for t in tok_json["added_tokens"]}
    decode_char = gpt2_byte_decoder()
    ranks = {bytes(decode_char[c] for c in tok): i for tok, i in tok_json["model"]["vocab"].items()
             if tok not in specials}
    tk = tiktoken.Encoding(name="gpt2_style", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    hf = tokenizers.Tokenizer.from_file(os.path.join(args.fixture, "tokenizer.json"))

    result = {"versions": {"tokenizers": tokenizers.__version__,
                           "tiktoken": getattr(tiktoken, "__version__", "?")}, "bytes": nbytes}
    tk_ids = tk.encode(text, allowed_special="all")
    result["tiktoken"] = {
        "tokens": len(tk_ids),
        "encode_mb_s": median_rate(lambda: tk.encode(text, allowed_special="all"), nbytes, args.runs),
        "encode_parallel_mb_s": median_rate(
            lambda: tk.encode_batch(parts, num_threads=args.threads, allowed_special="all"), nbytes, args.runs),
        "decode_mb_s": median_rate(lambda: tk.decode_bytes(tk_ids), nbytes, args.runs),
    }
    hf_ids = hf.encode(text, add_special_tokens=False).ids
    result["tokenizers"] = {
        "tokens": len(hf_ids),
        "encode_mb_s": median_rate(lambda: hf.encode(text, add_special_tokens=False), nbytes, args.runs),
        "encode_parallel_mb_s": median_rate(lambda: hf.encode_batch(parts, add_special_tokens=False), nbytes,
                                            args.runs),
        "decode_mb_s": median_rate(lambda: hf.decode(hf_ids, skip_special_tokens=False), nbytes, args.runs),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
