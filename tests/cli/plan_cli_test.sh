#!/usr/bin/env bash
# tessera plan end to end: the tables and --json of a catalog plan, --explain (also of a
# mixture of experts on an expert axis), the
# measured host, and its clear errors (unknown accelerator, unknown model, a mesh of
# unknown axes, a layout that does not split the batch), and the --html page.
source "$(dirname "$0")/cli_common.sh" "$@"

# GPT-2 124M's programs take minutes to trace, partition and cost per layout under the
# sanitizers: the sanitizer run (TESSERA_TEST_SIZE=small) plans the same model with 2 of
# its 12 layers, which exercises the same code.
catalog_model=(--model gpt2-124m)
[[ "${TESSERA_TEST_SIZE:-}" == small ]] && catalog_model+=(--set model.layers=2)

case "$case_name" in
catalog)
  out="$("$tessera" plan "${catalog_model[@]}" --batch 512 --seq 1024 --set model.compute_dtype=bfloat16 \
    --accelerators h100,tpu_v5p --chips 8..16 --tokens 1e10)"
  echo "$out"
  grep -q "^per accelerator" <<<"$out" || fail "no per-accelerator table"
  grep -q "^strong scaling" <<<"$out" || fail "no strong-scaling table"
  grep -q "^weak scaling" <<<"$out" || fail "no weak-scaling table"
  grep -qE "^h100 +8 " <<<"$out" || fail "no h100 row for 8 chips"
  grep -qE "^tpu_v5p +16 " <<<"$out" || fail "no tpu_v5p row for 16 chips"
  json="$("$tessera" plan "${catalog_model[@]}" --batch 512 --seq 1024 --accelerators h100 --chips 8,16 --json)"
  python3 - "$json" <<'PY' || fail "bad --json"
import json, sys
d = json.loads(sys.argv[1])
rows = d["strong_scaling"]
assert [r["chips"] for r in rows] == [8, 16], rows
for r in rows:
    assert r["found"] and r["step_seconds"] > 0 and 0 < r["mfu"] < 1, r
    assert r["memory"]["peak"] > r["memory"]["parameters"] > 0, r
    assert r["run"]["seconds"] >= r["run"]["raw_seconds"] > 0, r
    assert 0 < r["run"]["goodput"] <= 1, r
# Strong scaling: twice the chips never more memory per chip, never a slower step here.
assert rows[1]["memory"]["peak"] <= rows[0]["memory"]["peak"] * 1.0001, rows
assert rows[1]["step_seconds"] < rows[0]["step_seconds"], rows
PY
  ;;
explain)
  out="$("$tessera" plan --model gpt2-124m --batch 16 --seq 1024 --accelerators h100 --mesh data=1 --explain)"
  echo "$out"
  grep -qE "^matmul +gemm" <<<"$out" || fail "no matmul line in --explain"
  grep -q "^memory per chip: peak" <<<"$out" || fail "no memory breakdown in --explain"
  # A dropless mixture of experts over an expert axis: the dispatch and combine are ragged
  # all-to-alls of the routed rows (2 layers x 2 moves x forward and backward), planned at
  # a 2048-token group's 2048 x 2 assignments of 128 float32 (2.10 MB), half of them to the
  # other device: 8.39 MB per step (the padded [experts, 2048, dim] buffers: 16.78 MB).
  out="$("$tessera" plan --model mixtral-tiny --batch 16 --seq 256 --accelerators h100 --mesh expert=2 --explain)"
  echo "$out"
  grep -qE "^ragged_all_to_all +collective +8 +0.00 +8.39 " <<<"$out" ||
    fail "no 8 ragged all-to-alls of 8.39 MB in the expert plan"
  # With a capacity factor 1.25: padded all-to-alls of [experts, 1280, dim] float32, half sent:
  # 8 x 4 x 1280 x 128 x 4 B / 2 = 10.49 MB.
  out="$("$tessera" plan --model mixtral-tiny --set model.moe_capacity_factor=1.25 --batch 16 --seq 256 \
    --accelerators h100 --mesh expert=2 --explain)"
  echo "$out"
  grep -qE "^all_to_all +collective +8 +0.00 +10.49 " <<<"$out" || fail "no 8 all-to-alls of 10.49 MB in the capacity plan"
  ;;
host)
  out="$("$tessera" plan --config configs/tiny.toml --set train.batch=4 --set train.seq=64 --accelerators host \
    --chips 2 --explain)"
  echo "$out"
  grep -q "^host calibration" <<<"$out" || fail "no host calibration"
  grep -qE "^host +2 " <<<"$out" || fail "no host row for 2 devices"
  grep -qE "^all_reduce +collective|^reduce_scatter +collective|^all_gather +collective" <<<"$out" ||
    fail "no collective in the 2-device plan"
  ;;
errors)
  expect_error() {
    local want="$1"
    shift
    if out="$("$tessera" plan "$@" 2>&1)"; then fail "tessera plan $* succeeded"; fi
    grep -q -- "$want" <<<"$out" || fail "tessera plan $*: expected '$want' in: $out"
  }
  expect_error "unknown accelerator 'h900'" --model tiny --accelerators h900
  expect_error "unknown model 'gpt5'" --model gpt5
  expect_error "the planner lays out the axes pipeline, data, fsdp, expert and tensor (got 'model')" --model tiny --accelerators h100 \
    --mesh model=2
  expect_error "does not split over 3 data-parallel devices" --model tiny --set train.batch=8 --accelerators h100 \
    --mesh data=3
  expect_error "'parallel.pipeline_micro_batches' = 3 must divide the 8 sequences" --model tiny --set train.batch=8 \
    --set parallel.pipeline_micro_batches=3 --accelerators h100 --mesh pipeline=2
  expect_error "--chips 8..x" --model tiny --chips 8..x
  expect_error "exactly one of --model" --accelerators h100
  expect_error "cannot read the accelerator catalog $tmp/none.toml" --model tiny --catalog "$tmp/none.toml"
  printf '[x]\nname = "X"\n' >"$tmp/bad.toml"
  expect_error "$tmp/bad.toml:1: \[x\] needs match" --model tiny --catalog "$tmp/bad.toml"
  ;;
mesh_auto)
  # Two virtual devices: the planner chooses, says why, and a resume keeps the choice.
  tiny_train_args 2 --quiet
  out="$(TESSERA_CPU_DEVICES=2 "$tessera" "${train_args[@]}" --mesh auto --set run.dir="$tmp/run" 2>&1)" ||
    fail "first start: $out"
  echo "$out"
  grep -q "^parallel: --mesh auto chose .* for 2 devices: predicted step" <<<"$out" || fail "no choice line"
  mesh="$(cat "$tmp/run/mesh_auto")"
  [[ "$mesh" =~ ^(data|fsdp|tensor)=2$ ]] || fail "kept mesh '$mesh' is not a 2-device layout"
  tiny_train_args 4 --quiet
  out="$(TESSERA_CPU_DEVICES=2 "$tessera" "${train_args[@]}" --mesh auto --set run.dir="$tmp/run" 2>&1)" ||
    fail "resume: $out"
  grep -q "^parallel: --mesh auto keeps $mesh" <<<"$out" || fail "the resume did not keep $mesh: $out"
  grep -q "resumed from step 2" <<<"$out" || grep -q "steps            2 -> 4" <<<"$out" || fail "did not resume: $out"
  # A kept pipeline layout names its micro-batch count (the planner searches it): the run
  # trains with that count.
  mkdir -p "$tmp/piped"
  echo "pipeline=2 m=2" >"$tmp/piped/mesh_auto"
  tiny_train_args 2
  train_args+=(--set model.layers=2)  # a stage each
  out="$(TESSERA_CPU_DEVICES=2 "$tessera" "${train_args[@]}" --mesh auto --set run.dir="$tmp/piped" 2>&1)" ||
    fail "kept pipeline layout: $out"
  grep -q "^parallel: --mesh auto keeps pipeline=2 m=2" <<<"$out" || fail "did not keep pipeline=2 m=2: $out"
  grep -q "^parallel: mesh pipeline=2 .*, 2 micro-batches" <<<"$out" || fail "not 2 pipeline micro-batches: $out"
  ;;
html)
  out="$("$tessera" plan "${catalog_model[@]}" --batch 512 --seq 1024 --accelerators h100,tpu_v5p --chips 8..32 \
    --html "$tmp/p.html")"
  echo "$out"
  grep -q "^plan report: $tmp/p.html" <<<"$out" || fail "no 'plan report:' line"
  grep -q "^strong scaling" <<<"$out" || fail "--html dropped the tables"
  [[ -s "$tmp/p.html" ]] || fail "no page written"
  for want in '<svg' '>h100</text>' '>tpu_v5p</text>' 'id="summary"'; do
    grep -qF "$want" "$tmp/p.html" || fail "'$want' missing from the page"
  done
  ! grep -q "<script" "$tmp/p.html" || fail "the page has a script"
  ;;
*) fail "unknown case" ;;
esac
