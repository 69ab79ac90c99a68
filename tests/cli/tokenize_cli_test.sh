#!/usr/bin/env bash
# The `tessera tokenize` and `tessera data prepare` command lines end to end (registered
# with ctest by cmake/cli_tests.cmake, one test per case):
#   tokenize_cli_test.sh TESSERA_BINARY SOURCE_DIR CASE
# Cases: byte_round_trip, spm_round_trip, bad_ids, info_and_stats, prepare_threads.
# Exit status 0 when the case passes; a failure says what differed.
source "$(dirname "$0")/cli_common.sh" "$@"
spm="$src/tests/data/fixtures/tokenizers/spm/tokenizer.model"

# Lines of varied text, ending with a newline (so line-wise decode gives the file back).
write_text() {
  printf 'Hello, world!\n\n  two leading spaces\ttab\n日本語のテキスト 😀 Grüße\nnumbers 1234567890\nlast line\n' >"$1"
}

round_trip() {  # round_trip SPEC
  write_text "$tmp/in.txt"
  "$tessera" tokenize --tokenizer "$1" "$tmp/in.txt" >"$tmp/ids.txt"
  [[ $(wc -l <"$tmp/ids.txt") -eq 6 ]] || fail "$1: expected 6 lines of ids, got $(wc -l <"$tmp/ids.txt")"
  "$tessera" tokenize --tokenizer "$1" --decode <"$tmp/ids.txt" >"$tmp/out.txt"
  cmp -s "$tmp/in.txt" "$tmp/out.txt" || fail "$1: line-wise decode differs from the input"
  # The whole input as one sequence: one line, decoding to the input exactly.
  "$tessera" tokenize --tokenizer "$1" --whole - <"$tmp/in.txt" >"$tmp/whole.txt"
  [[ $(wc -l <"$tmp/whole.txt") -eq 1 ]] || fail "$1: --whole gave more than one line"
  "$tessera" tokenize --tokenizer "$1" -d "$tmp/whole.txt" >"$tmp/whole_out.txt"
  # decode adds the line's '\n' after the text, which already ends with one
  printf '\n' >>"$tmp/in.txt"
  cmp -s "$tmp/in.txt" "$tmp/whole_out.txt" || fail "$1: --whole then decode differs from the input"
}

case "$case_name" in
  byte_round_trip)
    round_trip byte
    printf 'AB c\n' | "$tessera" tokenize >"$tmp/ab.txt"
    [[ "$(cat "$tmp/ab.txt")" == "65 66 32 99" ]] || fail "byte ids of 'AB c': $(cat "$tmp/ab.txt")"
    ;;
  spm_round_trip)
    round_trip "spm:$spm"
    # tests/oracles/goldens/sentencepiece_model.json, case "Hello, world!" (pip sentencepiece 0.1.97)
    printf 'Hello, world!\n' | "$tessera" tokenize --tokenizer "$spm" >"$tmp/hello.txt"
    [[ "$(cat "$tmp/hello.txt")" == "374 461 908 927 689 954" ]] || fail "ids of 'Hello, world!': $(cat "$tmp/hello.txt")"
    ;;
  bad_ids)
    status=0
    printf '5 6\n7 99999 8\n' | "$tessera" tokenize --tokenizer "spm:$spm" --decode >/dev/null 2>"$tmp/err.txt" || status=$?
    [[ $status -eq 1 ]] || fail "out-of-vocabulary id: exit status $status, expected 1"
    grep -q "line 2: token 2 '99999' is outside the vocabulary \[0, 1000)" "$tmp/err.txt" ||
      fail "out-of-vocabulary id: message was: $(cat "$tmp/err.txt")"
    status=0
    printf '104 105\n1 x2\n' | "$tessera" tokenize --decode >/dev/null 2>"$tmp/err.txt" || status=$?
    [[ $status -eq 1 ]] || fail "non-integer token: exit status $status, expected 1"
    grep -q "line 2: token 2 'x2' is not an integer id" "$tmp/err.txt" ||
      fail "non-integer token: message was: $(cat "$tmp/err.txt")"
    status=0
    "$tessera" tokenize --tokenizer "spm:$tmp/missing.model" --info >/dev/null 2>"$tmp/err.txt" || status=$?
    [[ $status -eq 1 ]] && grep -q "missing.model" "$tmp/err.txt" || fail "missing model: $(cat "$tmp/err.txt")"
    ;;
  info_and_stats)
    "$tessera" tokenize --tokenizer "$spm" --info >"$tmp/info.txt"
    grep -Eq '^id +spm-[0-9a-f]{16}$' "$tmp/info.txt" || fail "--info id: $(cat "$tmp/info.txt")"
    grep -Eq "^spec +spm:$spm\$" "$tmp/info.txt" || fail "--info spec: $(cat "$tmp/info.txt")"
    grep -Eq '^vocab_size +1000$' "$tmp/info.txt" || fail "--info vocab: $(cat "$tmp/info.txt")"
    grep -Eq '^eos_id +2$' "$tmp/info.txt" || fail "--info eos: $(cat "$tmp/info.txt")"
    "$tessera" tokenize --info | grep -Eq '^eos_id +none$' || fail "byte --info should say eos_id none"
    printf 'abcd\nef\n' | "$tessera" tokenize --stats 2>"$tmp/stats.txt" >/dev/null
    grep -Eq '^6 bytes, 6 tokens, 1\.000 bytes/token, [0-9.]+ MB/s' "$tmp/stats.txt" || fail "--stats: $(cat "$tmp/stats.txt")"
    ;;
  prepare_threads)
    mkdir -p "$tmp/in"
    for i in 0 1 2 3 4 5 6 7; do
      write_text "$tmp/in/doc$i.txt"
      printf 'document %s without a final newline' "$i" >>"$tmp/in/doc$i.txt"
    done
    for threads in 1 3; do
      "$tessera" data prepare "$tmp/in" --out "$tmp/out$threads" --tokenizer "spm:$spm" --threads "$threads" \
        --no-progress >"$tmp/log$threads.txt"
      grep -Eq "encode .* MB/s on $threads thread" "$tmp/log$threads.txt" || fail "no throughput line: $(cat "$tmp/log$threads.txt")"
      grep -q "separator eos" "$tmp/log$threads.txt" || fail "auto should pick eos: $(cat "$tmp/log$threads.txt")"
    done
    for f in train.bin val.bin meta.json; do
      cmp -s "$tmp/out1/$f" "$tmp/out3/$f" || fail "$f differs between --threads 1 and --threads 3"
    done
    grep -q '"separator": "eos"' "$tmp/out1/meta.json" || fail "meta.json lacks the separator"
    status=0
    "$tessera" data prepare "$tmp/in" --out "$tmp/bad" --separator eos --no-progress >/dev/null 2>"$tmp/err.txt" || status=$?
    [[ $status -eq 1 ]] && grep -q "no end-of-text token" "$tmp/err.txt" || fail "--separator eos with byte: $(cat "$tmp/err.txt")"
    ;;
  data_stats)
    # Two text sources mixed 3:1; the realized mixture over the planned rows; bad weights.
    mkdir -p "$tmp/a" "$tmp/b"
    for i in 0 1 2; do write_text "$tmp/a/doc$i.txt"; write_text "$tmp/b/doc$i.txt"; done
    cat >"$tmp/mix.toml" <<EOF
[data]
val = "$tmp/val.bin"
[[data.mixture]]
name = "alpha"
path = "$tmp/a"
weight = 3
[[data.mixture]]
name = "beta"
path = "$tmp/b"
weight = 1
[train]
seq = 16
batch = 4
steps = 250
EOF
    "$tessera" data stats --config "$tmp/mix.toml" --json >"$tmp/stats.txt" || fail "data stats: $(cat "$tmp/stats.txt")"
    grep -Eq "alpha +text +1 .* 0\.7500 +0\.7500" "$tmp/stats.txt" || fail "alpha's mixture: $(cat "$tmp/stats.txt")"
    grep -Eq "beta +text +1 .* 0\.2500 +0\.2500" "$tmp/stats.txt" || fail "beta's mixture: $(cat "$tmp/stats.txt")"
    tail -1 "$tmp/stats.txt" | grep -q '"rows":1000' || fail "the JSON line: $(tail -1 "$tmp/stats.txt")"
    status=0
    "$tessera" data stats --config "$tmp/mix.toml" --set 'data.mixture=[{path = "a", weight = 0}]' \
      >/dev/null 2>"$tmp/err.txt" || status=$?
    [[ $status -ne 0 ]] && grep -q "weights sum to 0" "$tmp/err.txt" || fail "zero weights: $(cat "$tmp/err.txt")"
    ;;
  *)
    echo "unknown case '$case_name'" >&2
    exit 2
    ;;
esac
echo "ok: $case_name"
