#!/usr/bin/env bash
# Test hosts on one machine: N network namespaces that act as hosts tbh1..tbhN, for the
# multi-host tests (ctest label multihost) and for trying `tessera launch --hosts` by hand.
#
#   tools/testbed.sh check             exit 0 when this machine can make hosts, else say why (exit 1)
#   tools/testbed.sh up N              make hosts tbh1..tbhN (idempotent: the same N again is a no-op)
#   tools/testbed.sh down              remove every host (idempotent)
#   tools/testbed.sh hosts             the hosts that are up, comma-separated
#   tools/testbed.sh exec HOST CMD...  run CMD on HOST (its network, its hostname)
#   tools/testbed.sh agent HOST CMD... the same, shaped as an rsh agent: OpenMPI's mpirun
#                                      (`tessera launch --hosts ... --launch-agent`) calls it
#                                      as it would call ssh, with the remote command as words
#   tools/testbed.sh slurm up          a Slurm cluster on the hosts that are up: slurmctld on
#                                      tbh1, a slurmd on every host, a private munged;
#                                      `exec` then sets SLURM_CONF, so sbatch/srun/scontrol
#                                      on a host talk to it (`down` stops it too)
#   tools/testbed.sh slurm down        stop it and remove its state
#
# The Slurm cluster (Debian's slurm-wlm and munge, which `make deps` installs): its own
# munge key and socket, state, spool and logs under /run/tessera-testbed/slurm; PMIx for
# MPI (srun --mpi=pmix is the default, so OpenMPI ranks start without mpirun); no cgroups
# (proctrack/linuxproc); a job that exits 75 (tessera launch's spent restart budget) is
# requeued (RequeueExit=75), and may start again 10 s later (cred_expire=10; Slurm's
# default keeps a requeued job waiting 120 s). Each slurmd has its own spool and PMIx temporary directory,
# as separate machines would.
#
# Each host is a network namespace with its own loopback and one interface eth0 at
# 10.231.0.I/24, cabled to a bridge inside a namespace of its own (tbsw), so the hosts
# reach each other and nothing else; the machine's own network is not touched. Each
# command on a host runs in its network namespace plus fresh UTS and mount namespaces:
# the hostname is the host's and /etc/hosts (bound from /etc/netns/HOST/hosts) names
# every host; /sys and the rest of the filesystem are the machine's. So MPI
# sees distinct nodes and talks TCP between them, as across real machines. The
# filesystem is shared, as a cluster's shared storage would be.
#
# Needs root and iproute2 (`make deps` installs it); `check` says what is missing. A lock
# (flock) serializes up/down across concurrent callers.
set -euo pipefail

readonly switch=tbsw
readonly subnet=10.231.0
readonly lock=/run/lock/tessera-testbed.lock
readonly slurm_dir=/run/tessera-testbed/slurm

die() {
  echo "testbed: $*" >&2
  exit 1
}

why_not() {  # prints why hosts cannot be made here; empty when they can
  if [[ "$(id -u)" != 0 ]]; then
    echo "needs root (network namespaces); running as uid $(id -u)"
  elif ! command -v ip >/dev/null; then
    echo "needs iproute2's ip (make deps installs it)"
  elif ! command -v unshare >/dev/null; then
    echo "needs util-linux's unshare"
  elif ! ip netns add tbprobe$$ 2>/dev/null; then
    echo "cannot create a network namespace here (ip netns add failed: no CAP_SYS_ADMIN/CAP_NET_ADMIN?)"
  elif ! ip -n tbprobe$$ link add tbprobe0 type veth peer name tbprobe1 2>/dev/null; then
    ip netns del tbprobe$$ 2>/dev/null || true
    echo "cannot create a veth pair in a network namespace (no veth support?)"
  elif ! unshare --uts true 2>/dev/null; then
    ip netns del tbprobe$$ 2>/dev/null || true
    echo "cannot create a UTS namespace (unshare --uts failed)"
  else
    ip netns del tbprobe$$ 2>/dev/null || true
  fi
}

hosts_up() {  # tbh1 tbh2 ... in order
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tbh[0-9]+$' | sort -V || true
}

pid_of() {  # a daemon's pid from its pid file, if it runs
  local pid
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

slurm_down_locked() {
  [[ -d "$slurm_dir" ]] || return 0
  local file pid
  # Our cluster's jobs first (its slurmctld; a machine's own Slurm is never touched), so
  # no job step outlives its slurmd.
  if [[ -n "$(pid_of "$slurm_dir/slurmctld.pid")" ]]; then
    "$0" exec tbh1 scancel --full --user="$(id -un)" 9>&- 2>/dev/null || true
    for _ in $(seq 75); do
      [[ -z "$("$0" exec tbh1 squeue -h -t running,completing 9>&- 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  for file in "$slurm_dir"/slurmd-*.pid "$slurm_dir/slurmctld.pid" "$slurm_dir/munged.pid"; do
    pid="$(pid_of "$file")" || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$slurm_dir"
}

slurm_up_locked() {
  local hosts host i
  hosts="$(hosts_up)"
  [[ -n "$hosts" ]] || die "slurm up: no hosts (tools/testbed.sh up N first)"
  for tool in slurmctld slurmd sbatch munged mungekey; do
    command -v "$tool" >/dev/null || die "slurm up: $tool is missing (make deps installs slurm-wlm and munge)"
  done
  slurm_down_locked
  mkdir -p "$slurm_dir/state"
  # A private munge: its own key, socket and files (a munged of the machine's is untouched).
  mungekey --create --keyfile="$slurm_dir/munge.key" --bits=1024 2>/dev/null ||
    dd if=/dev/urandom of="$slurm_dir/munge.key" bs=128 count=1 status=none
  chmod 600 "$slurm_dir/munge.key"
  chmod 700 "$slurm_dir"
  # 9>&-: the daemons must not inherit the lock (with_lock's descriptor 9).
  munged --force --socket="$slurm_dir/munge.socket" --key-file="$slurm_dir/munge.key" \
    --pid-file="$slurm_dir/munged.pid" --log-file="$slurm_dir/munged.log" --seed-file="$slurm_dir/munged.seed" 9>&- ||
    die "slurm up: munged did not start: $(tail -3 "$slurm_dir/munged.log" 2>/dev/null)"
  local nodes=""
  for host in $hosts; do
    i="${host#tbh}"
    nodes+="NodeName=$host NodeAddr=$subnet.$i CPUs=$(nproc) State=UNKNOWN"$'\n'
    mkdir -p "$slurm_dir/spool-$host" "$slurm_dir/tmp-$host"
  done
  cat >"$slurm_dir/slurm.conf" <<CONF
ClusterName=tessera-testbed
SlurmctldHost=tbh1($subnet.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$slurm_dir/munge.socket,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=pmix
ReturnToService=2
RequeueExit=75
JobRequeue=1
KillWait=10
InactiveLimit=0
MinJobAge=600
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool-%n
TmpFS=$slurm_dir/tmp-%n
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd-%n.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd-%n.log
$nodes
PartitionName=testbed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  "$0" exec tbh1 slurmctld -f "$slurm_dir/slurm.conf" 9>&- || die "slurm up: slurmctld did not start: $(tail -5 "$slurm_dir/slurmctld.log")"
  for host in $hosts; do
    "$0" exec "$host" slurmd -f "$slurm_dir/slurm.conf" -N "$host" 9>&- ||
      die "slurm up: slurmd on $host did not start: $(tail -5 "$slurm_dir/slurmd-$host.log")"
  done
  local state=""
  for _ in $(seq 100); do
    state="$("$0" exec tbh1 sinfo -h -o "%T %D" 2>/dev/null || true)"
    [[ "$state" == "idle $(wc -w <<<"$hosts")" ]] && return 0
    sleep 0.3
  done
  die "slurm up: the nodes are not idle after 30 s (sinfo: '$state'); logs in $slurm_dir"
}

down_locked() {
  slurm_down_locked
  local host
  for host in $(hosts_up); do
    ip netns del "$host" 2>/dev/null || true
    rm -rf "/etc/netns/$host"
  done
  ip netns del "$switch" 2>/dev/null || true
}

up_locked() {
  local n="$1" i host
  local current
  current="$(hosts_up | tr '\n' ' ')"
  local wanted=""
  for ((i = 1; i <= n; ++i)); do wanted+="tbh$i "; done
  if [[ "$current" == "$wanted" ]] && ip netns list | grep -qw "$switch"; then return 0; fi
  down_locked
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  local hosts_file="127.0.0.1 localhost"$'\n'
  for ((i = 1; i <= n; ++i)); do hosts_file+="$subnet.$i tbh$i"$'\n'; done
  for ((i = 1; i <= n; ++i)); do
    host="tbh$i"
    ip netns add "$host"
    # Both ends are made inside the switch, then one moves into the host: nothing is
    # ever created in the machine's own namespace.
    ip -n "$switch" link add "p$i" type veth peer name "e$i"
    ip -n "$switch" link set "e$i" netns "$host"
    ip -n "$switch" link set "p$i" master br0
    ip -n "$switch" link set "p$i" up
    ip -n "$host" link set "e$i" name eth0
    ip -n "$host" addr add "$subnet.$i/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" link set lo up
    mkdir -p "/etc/netns/$host"
    printf '%s' "$hosts_file" >"/etc/netns/$host/hosts"
  done
}

with_lock() {
  mkdir -p "$(dirname "$lock")"
  exec 9>"$lock"
  flock 9
  "$@"
}

run_on() {  # HOST CMD...
  local host="$1"
  shift
  [[ "$host" =~ ^tbh[0-9]+$ ]] || die "'$host' is not a testbed host (tbh1, tbh2, ...)"
  ip netns list | awk '{print $1}' | grep -qx "$host" || die "host $host is not up (tools/testbed.sh up N)"
  # Not `ip netns exec`: it remounts /sys for the namespace, which hides the cgroup
  # mounts slurmd needs. The host's /etc/hosts is bound in a private mount namespace.
  [[ -f "$slurm_dir/slurm.conf" ]] && export SLURM_CONF="$slurm_dir/slurm.conf"
  exec nsenter --net="/run/netns/$host" unshare --uts --mount --propagation private /bin/sh -c \
    'mount --bind "/etc/netns/$0/hosts" /etc/hosts && hostname "$0" && exec "$@"' "$host" "$@"
}

command="${1:-}"
[[ $# -gt 0 ]] && shift
case "$command" in
  check)
    reason="$(why_not)"
    [[ -z "$reason" ]] || die "$reason"
    ;;
  up)
    [[ "${1:-}" =~ ^[1-9][0-9]?$ ]] || die "up N: N must be a host count from 1 to 99, got '${1:-}'"
    reason="$(why_not)"
    [[ -z "$reason" ]] || die "$reason"
    with_lock up_locked "$1"
    ;;
  down)
    with_lock down_locked
    ;;
  hosts)
    hosts_up | paste -sd, -
    ;;
  exec)
    [[ $# -ge 2 ]] || die "exec HOST CMD...: missing the host or the command"
    run_on "$@"
    ;;
  agent)
    # An rsh agent gets the remote command as words a remote shell would join and parse.
    [[ $# -ge 2 ]] || die "agent HOST CMD...: missing the host or the command"
    host="$1"
    shift
    run_on "$host" /bin/sh -c "$*"
    ;;
  slurm)
    case "${1:-}" in
      up) with_lock slurm_up_locked ;;
      down) with_lock slurm_down_locked ;;
      *) die "usage: tools/testbed.sh slurm up | down" ;;
    esac
    ;;
  *)
    die "usage: tools/testbed.sh check | up N | down | hosts | exec HOST CMD... | agent HOST CMD... | slurm up|down"
    ;;
esac
