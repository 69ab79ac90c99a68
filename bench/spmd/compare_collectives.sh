#!/usr/bin/env bash
# The TCP communicator against OpenMPI on this machine, same ranks, same algorithms
# (both communicators run a reduction as an all-to-all, the ordered sum and an
# all-gather; only the transport differs): bench_collectives as a TCP job (`tessera
# launch --coordinator`), under mpirun over OpenMPI's TCP transport (ob1 + btl tcp), and
# under mpirun over shared memory (ob1 + btl vader), in interleaved rounds.
#
#   bash bench/spmd/compare_collectives.sh [BUILD_DIR] [ROUNDS]      (NP=2 ranks by default)
#
# Prints the median bus bandwidth of each op and size per runner and the ratio of TCP to
# OpenMPI-over-TCP; the last line is one JSON object (tcp_vs_mpi_tcp_busbw_64mib for the
# all-reduce of 64 MiB, the largest size).
set -euo pipefail
build="${1:-build}"
rounds="${2:-3}"
np="${NP:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
bench="$build/bin/bench_collectives"
[[ -x "$bench" ]] || { echo "no $bench (build with -DTESSERA_BUILD_BENCH=ON)" >&2; exit 2; }

run() {  # RUNNER ROUND
  case "$1" in
    tcp) "$build/bin/tessera" launch --nproc "$np" --coordinator 127.0.0.1:0 --max-restarts 0 --run-dir "$tmp/run" \
      -- "$bench" 2>/dev/null ;;
    mpi_tcp) mpirun -n "$np" --mca pml ob1 --mca btl self,tcp "$bench" ;;
    mpi_shm) mpirun -n "$np" --mca pml ob1 --mca btl self,vader "$bench" ;;
  esac | tail -n 1 >"$tmp/$1.$2.json"
}
for ((r = 0; r < rounds; ++r)); do
  for runner in tcp mpi_tcp mpi_shm; do run "$runner" "$r"; done
done

python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
runners = ["tcp", "mpi_tcp", "mpi_shm"]
busbw = {}  # (runner, op, bytes) -> [GB/s per round]
devices = None
for runner in runners:
    for r in range(rounds):
        result = json.load(open(f"{tmp}/{runner}.{r}.json"))
        devices = result["devices"]
        for row in result["rows"]:
            busbw.setdefault((runner, row["op"], row["bytes"]), []).append(row["busbw_gbs"])
keys = sorted({(op, b) for (_, op, b) in busbw}, key=lambda k: (k[0], k[1]))
print(f"bus bandwidth GB/s, median of {rounds} interleaved runs, {devices} ranks")
print(f"{'op':<12} {'bytes':>10} {'tessera tcp':>12} {'openmpi tcp':>12} {'openmpi shm':>12} {'tcp/mpi-tcp':>12}")
rows = []
for op, b in keys:
    m = {runner: statistics.median(busbw[(runner, op, b)]) for runner in runners}
    ratio = m["tcp"] / m["mpi_tcp"] if m["mpi_tcp"] > 0 else float("nan")
    rows.append({"op": op, "bytes": b, **{f"{k}_busbw_gbs": round(v, 4) for k, v in m.items()},
                 "tcp_vs_mpi_tcp": round(ratio, 3)})
    print(f"{op:<12} {b:>10} {m['tcp']:>12.3f} {m['mpi_tcp']:>12.3f} {m['mpi_shm']:>12.3f} {ratio:>12.2f}")
largest = max(b for _, b in keys)
big = next(r for r in rows if r["op"] == "all_reduce" and r["bytes"] == largest)
print(json.dumps({"bench": "compare_collectives", "devices": devices, "rounds": rounds, "rows": rows,
                  "tcp_vs_mpi_tcp_busbw_64mib": big["tcp_vs_mpi_tcp"]}))
PY
