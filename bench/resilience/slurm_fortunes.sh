#!/usr/bin/env bash
# The fortunes job (configs/fortunes.toml) for about 3 minutes on a 2-node Slurm cluster
# (tools/testbed.sh: two hosts made of network namespaces on this machine, slurmctld and a
# slurmd on each), one rank per node (`--mesh data=2`, one MPI job started by srun through
# PMIx), under `tessera launch --srun`, with one injected failure: rank 1 SIGKILLed at
# step KILL_STEP. The job is submitted while another job holds both nodes for BLOCK_S
# seconds, so it queues. At the end, `tessera goodput` on the run: scheduling wait from
# Slurm's own submit and start times, runtime goodput from the job's events, program
# goodput (MFU) from the steps.
#
#   bench/resilience/slurm_fortunes.sh [RUN_DIR] [SECONDS] [KILL_STEP] [BLOCK_S]
#
# Defaults: /tmp/slurm-fortunes, 180 s of training, step 150, 20 s. Needs root (the test
# hosts) and `make build`. Prints the launcher's and the trainer's output, then the
# goodput report (text, then its JSON as the last line).
set -euo pipefail
cd "$(dirname "$0")/../.."
run_dir="${1:-/tmp/slurm-fortunes}"
seconds="${2:-180}"
kill_step="${3:-150}"
block_s="${4:-20}"
testbed="$PWD/tools/testbed.sh"
tessera="$PWD/build/bin/tessera"
[[ -x "$tessera" ]] || { echo "slurm_fortunes: build first (make build)" >&2; exit 2; }
"$testbed" check
rm -rf "$run_dir"
work="$(mktemp -d)"
trap '"$testbed" down; rm -rf "$work"' EXIT
"$testbed" up 2
"$testbed" slurm up

cat >"$work/job.sh" <<JOB
#!/usr/bin/env bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
echo "job \$SLURM_JOB_ID on \$SLURM_JOB_NODELIST"
exec $tessera launch --srun --nproc 2 --max-restarts 3 -- $tessera train --config configs/fortunes.toml \\
  --mesh data=2 --set train.time_limit_s=$seconds --set run.dir=$run_dir --quiet
JOB
"$testbed" exec tbh1 sbatch --parsable -N 2 --exclusive --output=/dev/null --wrap "sleep $block_s" >/dev/null
job="$(TESSERA_FAULT="kill@step=$kill_step,rank=1" "$testbed" exec tbh1 sbatch --parsable -N 2 --ntasks-per-node=1 \
  --chdir="$PWD" --output="$work/job.out" "$work/job.sh")"
echo "submitted job $job behind a ${block_s} s job holding both nodes"
while :; do
  state="$("$testbed" exec tbh1 scontrol show job -o "$job" | tr ' ' '\n' | sed -n 's/^JobState=//p')"
  case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
  sleep 2
done
echo "job $job: $state"
cat "$work/job.out"
echo "== tessera goodput $run_dir"
"$tessera" goodput "$run_dir"
"$tessera" goodput "$run_dir" --json | tr -d '\n'
echo
