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
#
# Each host is a network namespace with its own loopback and one interface eth0 at
# 10.231.0.I/24, cabled to a bridge inside a namespace of its own (tbsw), so the hosts
# reach each other and nothing else; the machine's own network is not touched. A host's
# /etc/hosts (ip netns exec binds /etc/netns/HOST/hosts over it) names every host, and
# each command on it runs in a fresh UTS namespace whose hostname is the host's, so MPI
# sees distinct nodes and talks TCP between them, as across real machines. The
# filesystem is shared, as a cluster's shared storage would be.
#
# Needs root and iproute2 (`make deps` installs it); `check` says what is missing. A lock
# (flock) serializes up/down across concurrent callers.
set -euo pipefail

readonly switch=tbsw
readonly subnet=10.231.0
readonly lock=/run/lock/tessera-testbed.lock

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

down_locked() {
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
  exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
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
  *)
    die "usage: tools/testbed.sh check | up N | down | hosts | exec HOST CMD... | agent HOST CMD..."
    ;;
esac
