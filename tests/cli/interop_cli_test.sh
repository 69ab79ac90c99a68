#!/usr/bin/env bash
# The interop command lines end to end (registered with ctest by cmake/cli_tests.cmake):
#   interop_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases:
#   bpe_train_sample  configs/fortunes-bpe.toml, shrunk to a few steps: data prepared with
#                     the tokenizer.json fixture (EOS between documents), the checkpoint
#                     records the tokenizer, `sample` reloads it and decodes
#   hf_round_trip     import-hf of the GPT-2 fixture -> verify -> export-hf (sharded,
#                     bfloat16 and float32) -> import-hf again: the params file is
#                     byte-identical; bad directories are clear errors and write nothing
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"

expect_error() {  # expect_error "MESSAGE REGEX" COMMAND...: exit status 1 and the message on stderr
  local pattern="$1" status=0
  shift
  "$@" >/dev/null 2>"$tmp/err.txt" || status=$?
  [[ $status -ne 0 ]] || fail "'$*' succeeded, expected an error"
  grep -Eq "$pattern" "$tmp/err.txt" || fail "'$*': expected /$pattern/, got: $(cat "$tmp/err.txt")"
}

case "$case_name" in
  bpe_train_sample)
    spec="hf:tests/data/fixtures/tokenizers/gpt2_style/tokenizer.json"
    id="$("$tessera" tokenize --tokenizer "$spec" --info | awk '$1 == "id" {print $2}')"
    [[ "$id" == bpe-* ]] || fail "tokenizer id '$id'"
    "$tessera" train --config configs/fortunes-bpe.toml --set run.dir="$tmp/run" \
      --set data.train="$tmp/data/train.bin" --set data.val="$tmp/data/val.bin" \
      --set model.vocab=1500 --set model.layers=1 --set model.dim=64 --set model.heads=2 --set model.context=64 \
      --set train.steps=3 --set train.batch=2 --set train.seq=64 --set train.eval_batches=1 \
      --set train.eval_interval=0 --set schedule.warmup_steps=1 --set checkpoint.interval=3 \
      --set run.tensorboard=false >"$tmp/train.txt" 2>&1 || fail "train: $(tail -5 "$tmp/train.txt")"
    grep -q "\"separator\": \"eos\"" "$tmp/data/meta.json" || fail "meta.json has no eos separator"
    grep -q "\"tokenizer\": \"$id\"" "$tmp/data/meta.json" || fail "meta.json does not name tokenizer $id"
    manifest="$(ls -d "$tmp"/run/checkpoints/step_*/manifest.json | tail -1)"
    grep -q "\"tokenizer\": \"$id\"" "$manifest" || fail "the checkpoint does not record tokenizer $id"
    grep -q "\"tokenizer_spec\": \"hf:$src/tests/data/fixtures/tokenizers/gpt2_style/tokenizer.json\"" "$manifest" ||
      fail "the checkpoint's tokenizer_spec is not the absolute path: $(grep tokenizer_spec "$manifest")"
    "$tessera" sample --ckpt "$tmp/run" --prompt "The meaning of life" --max-tokens 8 --seed 3 \
      >"$tmp/sample.txt" 2>"$tmp/sample_err.txt" || fail "sample: $(cat "$tmp/sample_err.txt")"
    grep -q "^The meaning of life" "$tmp/sample.txt" || fail "sample output: $(cat "$tmp/sample.txt")"
    # Another tokenizer: one whose vocabulary (1504) does not fit the model's (1500) is
    # refused; one that fits (SentencePiece, 1000) samples with a warning.
    expect_error "does not fit the model" "$tessera" sample --ckpt "$tmp/run" \
      --tokenizer tests/data/fixtures/tokenizers/llama3_style/tokenizer.json --max-tokens 2
    "$tessera" sample --ckpt "$tmp/run" --tokenizer tests/data/fixtures/tokenizers/spm/tokenizer.model \
      --max-tokens 2 >/dev/null 2>"$tmp/warn.txt" || fail "sample with another tokenizer: $(cat "$tmp/warn.txt")"
    grep -q "was trained with $id" "$tmp/warn.txt" || fail "no warning about the tokenizer: $(cat "$tmp/warn.txt")"
    ;;
  hf_round_trip)
    fixture="tests/interop/fixtures/hf_gpt2"
    "$tessera" ckpt import-hf "$fixture" "$tmp/a" >/dev/null 2>&1 || fail "import-hf $fixture"
    "$tessera" ckpt verify "$tmp/a" >/dev/null || fail "the imported checkpoint does not verify"
    "$tessera" ckpt export-hf "$tmp/a" "$tmp/exported" --max-shard-size 20KB >/dev/null 2>&1 || fail "export-hf"
    [[ -f "$tmp/exported/model.safetensors.index.json" ]] || fail "no shard index for a 20KB shard size"
    ls "$tmp"/exported/model-00001-of-*.safetensors >/dev/null || fail "no HF-named shards"
    grep -q '"model_type": "gpt2"' "$tmp/exported/config.json" || fail "config.json: $(cat "$tmp/exported/config.json")"
    "$tessera" ckpt import-hf "$tmp/exported" "$tmp/b" >/dev/null 2>&1 || fail "import-hf of the export"
    cmp -s "$tmp"/a/checkpoints/step_*/params.safetensors "$tmp"/b/checkpoints/step_*/params.safetensors ||
      fail "params after export -> import differ from the first import"
    "$tessera" ckpt export-hf "$tmp/a" "$tmp/bf16" --dtype bfloat16 >/dev/null 2>&1 || fail "export-hf --dtype bfloat16"
    grep -q '"torch_dtype": "bfloat16"' "$tmp/bf16/config.json" || fail "bf16 export's config.json"
    # Errors: an existing target, an unsupported architecture, a lying header; nothing written.
    expect_error "exists" "$tessera" ckpt export-hf "$tmp/a" "$tmp/exported"
    mkdir "$tmp/bert" && printf '{"model_type": "bert", "architectures": ["BertModel"]}' >"$tmp/bert/config.json"
    expect_error "bert" "$tessera" ckpt import-hf "$tmp/bert" "$tmp/c"
    [[ ! -e "$tmp/c" ]] || fail "a failed import left $tmp/c"
    cp -r "$fixture" "$tmp/lying"
    python3 - "$tmp/lying/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
name = sorted(k for k in header if k != "__metadata__")[0]
header[name]["data_offsets"][1] += 1 << 20  # claims a megabyte more than the file holds
text = json.dumps(header).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
    expect_error "model.safetensors" "$tessera" ckpt import-hf "$tmp/lying" "$tmp/d"
    [[ ! -e "$tmp/d" ]] || fail "a failed import left $tmp/d"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "ok ($case_name)"
