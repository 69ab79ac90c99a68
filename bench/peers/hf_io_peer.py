#!/usr/bin/env python3
"""Peer of bench/bench_hf_io.cpp: transformers loading and saving the Hugging Face
directories tessera exported, run with the oracle venv's python (.venv-oracles/,
tests/oracles/requirements-hf.txt; `tests/oracles/run_oracle.sh hf_models` installs it).

  hf_io_peer.py --single DIR --sharded DIR --max-shard-size 100MB --out TMPDIR [--runs 5]

For each directory (single model.safetensors, sharded with an index), medians over --runs
after one untimed warm-up run of:
  from_pretrained:  AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)
  save_pretrained:  model.save_pretrained(out, safe_serialization=True) into a fresh
                    directory (max_shard_size as the export: none for single, --max-shard-size
                    for sharded); the directory is removed outside the timed region
  load_file:        safetensors.torch.load_file on every safetensors file (the floor: read
                    the bytes into tensors, no model built)
Both loaders map the files (mmap) and fault pages in lazily, so the plain times do not read
the data; the "_touched" variants also read one float per 4 KiB page of every tensor (a
strided sum), which makes every page resident: the fair comparison with a loader that
copies the bytes into its own memory.
Prints one JSON line: {"single": {"from_pretrained_s", "from_pretrained_touched_s",
"save_pretrained_s", "load_file_s", "load_file_touched_s", "files"}, "sharded": {...},
"threads", "versions"}.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import time


def median_seconds(fn, runs, after=None):
    fn()
    if after:
        after()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if after:
            after()
    return statistics.median(times)


def touch(tensors):
    """Reads one float32 of every 4 KiB page (every page faulted in), returns the sum."""
    total = 0.0
    for t in tensors:
        total += float(t.detach().reshape(-1)[::1024].sum())
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--single", required=True)
    ap.add_argument("--sharded", required=True)
    ap.add_argument("--max-shard-size", default="100MB")
    ap.add_argument("--out", required=True, help="scratch directory for save_pretrained")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    import safetensors
    import safetensors.torch
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # transformers 5 names the argument dtype; 4.x called it torch_dtype.
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}

    result = {}
    for kind, directory, shard in (("single", args.single, None), ("sharded", args.sharded, args.max_shard_size)):
        files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
        model = AutoModelForCausalLM.from_pretrained(directory, **dtype_kw)
        load = median_seconds(lambda: AutoModelForCausalLM.from_pretrained(directory, **dtype_kw), args.runs)
        load_touched = median_seconds(
            lambda: touch(AutoModelForCausalLM.from_pretrained(directory, **dtype_kw).state_dict().values()), args.runs)
        out = os.path.join(args.out, kind)
        save_kw = {"safe_serialization": True}
        if shard:
            save_kw["max_shard_size"] = shard

        def remove_out():
            shutil.rmtree(out, ignore_errors=True)

        remove_out()
        save = median_seconds(lambda: model.save_pretrained(out, **save_kw), args.runs, after=remove_out)
        floor = median_seconds(lambda: [safetensors.torch.load_file(f) for f in files], args.runs)
        floor_touched = median_seconds(
            lambda: [touch(safetensors.torch.load_file(f).values()) for f in files], args.runs)
        result[kind] = {"from_pretrained_s": load, "from_pretrained_touched_s": load_touched,
                        "save_pretrained_s": save, "load_file_s": floor, "load_file_touched_s": floor_touched,
                        "files": len(files)}
        del model
    result["threads"] = torch.get_num_threads()
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "safetensors": safetensors.__version__}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
