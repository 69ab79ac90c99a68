#!/usr/bin/env bash
# tools/fresh-machine.sh: run the README's commands on a clean Debian 12, as a newcomer would.
#
#   tools/fresh-machine.sh [train|test|configure] [options]
#
#   train      `make train` (installs, builds, trains on the embedded default)
#   test       `make test`  (installs, builds, runs every test)
#   configure  `make configure-all`: `make deps`, then the cmake configure of the trees
#              `make build` and `make test` use (what .ci/run checks, in a few minutes)
#
# What it does:
#   1. A base root, made once and cached: `debootstrap --variant=minbase bookworm` with
#      only git, make, ca-certificates and sudo added, Debian's usual apt sources
#      (bookworm, -updates, -security), and a user `newcomer` who may use sudo.
#   2. A fresh copy of that root for each run; the current commit (HEAD, not the
#      uncommitted changes) is cloned into /home/newcomer/tessera.
#   3. The command runs there as `newcomer` (--as-root: as root), in private mount, PID
#      and hostname namespaces (/proc, /sys, /dev, a fresh /dev/shm; host name
#      fresh-debian), with a clean environment and the host's network (apt needs it).
#      Its whole output goes to a log; every minute a progress line shows the newest line.
#   4. It prints the log's last lines, the exit status and the time taken, and removes
#      the copy (--keep leaves it).
#
# The host's packages are never touched (debootstrap must already be there: apt-get
# install debootstrap). Kept between runs, under --cache: the base root, the downloaded
# .deb files (apt's archive cache: saves downloads, still installs every package) and
# the compile cache (ccache; --no-ccache compiles everything cold).
#
# Options:
#   --as-root          run the command as root instead of the sudo-using newcomer
#   --keep             keep the root afterwards (its path is printed)
#   --commit REV       clone REV instead of HEAD
#   --make-args "..."  extra arguments to make (e.g. TRAIN_ARGS=..., JOBS=2)
#   --timeout SECONDS  stop the command after this long (exit 124)
#   --lines N          how many of the log's last lines to print (default 30)
#   --log FILE         where the full log goes (default CACHE/logs/MODE-DATE.log)
#   --cache DIR        default $TESSERA_FRESH_CACHE or ~/.cache/tessera-fresh-machine
#   --no-ccache        no compile cache
#   --rebuild-base     make the base root again
#   --mirror URL       Debian mirror (default http://deb.debian.org/debian)
#
# Exit status: the command's; 2 when this machine cannot make a root (not root, no
# debootstrap, no network) or the arguments are wrong.
set -euo pipefail

mode=""
as_root=0 keep=0 use_ccache=1 rebuild_base=0 timeout_s=0 lines=30
commit=HEAD make_args="" log="" mirror="http://deb.debian.org/debian"
cache="${TESSERA_FRESH_CACHE:-${HOME:-/root}/.cache/tessera-fresh-machine}"

die() {
  echo "fresh-machine: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    train | test | configure) mode="$1" ;;
    --as-root) as_root=1 ;;
    --keep) keep=1 ;;
    --no-ccache) use_ccache=0 ;;
    --rebuild-base) rebuild_base=1 ;;
    --commit | --make-args | --timeout | --lines | --log | --cache | --mirror)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --commit) commit="$2" ;;
        --make-args) make_args="$2" ;;
        --timeout) timeout_s="$2" ;;
        --lines) lines="$2" ;;
        --log) log="$2" ;;
        --cache) cache="$2" ;;
        --mirror) mirror="$2" ;;
      esac
      shift
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown argument '$1' (usage: tools/fresh-machine.sh [train|test|configure] [options]; --help)" ;;
  esac
  shift
done
[ -n "$mode" ] || die "which command? tools/fresh-machine.sh train|test|configure (--help for options)"
[[ "$timeout_s" =~ ^[0-9]+$ ]] || die "--timeout takes whole seconds, not '$timeout_s'"
[[ "$lines" =~ ^[0-9]+$ ]] || die "--lines takes a count, not '$lines'"
case "$mode" in
  train) target="train" ;;
  test) target="test" ;;
  configure) target=configure-all ;;
esac

# ---- what this machine must offer -------------------------------------------------
[ "$(id -u)" = 0 ] ||
  die "CANNOT RUN: needs root (debootstrap, chroot and mounts); run it as root or under sudo"
command -v debootstrap >/dev/null ||
  die "CANNOT RUN: debootstrap is not installed on this machine (as root: apt-get install debootstrap)"
command -v unshare >/dev/null || die "CANNOT RUN: unshare (util-linux) is missing"
repo="$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
sha="$(git -C "$repo" rev-parse --verify "$commit^{commit}")" || die "no commit '$commit' in $repo"
if [ "$commit" = HEAD ] && [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine: note: uncommitted changes are not copied; the root gets commit ${sha:0:12} only"
fi

mkdir -p "$cache/logs" "$cache/roots" "$cache/apt-archives/partial"
# One run at a time per cache: runs share the base root and apt's archive directory.
exec 9>"$cache/lock"
if ! flock -n 9; then
  echo "fresh-machine: another run is using $cache; waiting for it"
  flock 9
fi
base="$cache/bookworm-minbase.tar"
newcomer_uid=1000

# ---- 1. the base root (cached) ------------------------------------------------------
make_base() {
  local staging="$cache/base-staging"
  rm -rf "$staging"
  echo "fresh-machine: making the base root (debootstrap --variant=minbase bookworm; a few minutes)"
  if ! debootstrap --variant=minbase --include=git,make,ca-certificates,sudo bookworm "$staging" "$mirror" \
    >"$cache/logs/debootstrap.log" 2>&1; then
    tail -n 15 "$cache/logs/debootstrap.log" >&2
    die "CANNOT RUN: debootstrap failed (no network to $mirror?); log: $cache/logs/debootstrap.log"
  fi
  # The apt sources of a Debian 12 installation.
  cat >"$staging/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  # A new user of the machine, allowed to use sudo (as the installer's first user is);
  # NOPASSWD stands for the password they would type.
  chroot "$staging" useradd --create-home --uid "$newcomer_uid" --shell /bin/bash newcomer
  echo "newcomer ALL=(ALL:ALL) NOPASSWD: ALL" >"$staging/etc/sudoers.d/newcomer"
  chmod 0440 "$staging/etc/sudoers.d/newcomer"
  echo fresh-debian >"$staging/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\tfresh-debian\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    >"$staging/etc/hosts"
  rm -rf "$staging"/var/cache/apt/archives/*.deb "$staging"/var/lib/apt/lists/*_Packages
  tar -C "$staging" -cf "$base.tmp" .
  mv "$base.tmp" "$base"
  rm -rf "$staging"
  echo "fresh-machine: base root cached in $base ($(du -h "$base" | cut -f1))"
}
if [ "$rebuild_base" = 1 ] || [ ! -s "$base" ]; then make_base; fi

# ---- 2. a fresh copy, and the commit cloned into it ---------------------------------
root="$(mktemp -d "$cache/roots/$mode-XXXXXX")"
# Deleting the copy while something is mounted under it would reach into the host's
# /dev; the mounts live in the run's own namespace, but check anyway.
remove_root() {
  if grep -q " ${root}/" /proc/self/mountinfo; then
    echo "fresh-machine: something is still mounted under $root; not deleting it" >&2
    return
  fi
  rm -rf "$root"
}
trap '[ "$keep" = 1 ] || remove_root' EXIT
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host's own certificate authorities (a network that inspects TLS, as this CI's does)
# join the root's, so HTTPS to PyPI (the Python package's pinned build tools) works as it
# does from a user's machine. Plumbing of the host's network, like resolv.conf: nothing a
# user installs.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 ||
    echo "fresh-machine: warning: update-ca-certificates failed in the root" >&2
fi
home="$root/home/newcomer"
git clone --quiet --no-hardlinks "$repo" "$home/tessera"
git -C "$home/tessera" checkout --quiet --detach "$sha"
git -C "$home/tessera" remote remove origin
chown -R "$newcomer_uid:$newcomer_uid" "$home"

if [ "$as_root" = 1 ]; then
  user_home=/root user_spec=0:0 user_name=root
  workdir=/root/tessera
  mv "$home/tessera" "$root/root/tessera"
  chown -R 0:0 "$root/root/tessera"
else
  user_home=/home/newcomer user_spec="$newcomer_uid:$newcomer_uid" user_name=newcomer
  workdir=/home/newcomer/tessera
fi

# ---- 3. the command, in its own mount, PID and hostname namespaces ----------------
[ -n "$log" ] || log="$cache/logs/$mode-$(date +%Y%m%d-%H%M%S).log"
mkdir -p "$(dirname "$log")"
# The command, as a script inside the root (no quoting through chroot and su).
{
  echo 'set -e'
  printf 'cd %q\n' "$workdir"
  printf 'echo %q\n' "+ make $target $make_args"
  echo "exec make $target $make_args"
} >"$root/fresh-machine-command.sh"
inner_env=(HOME="$user_home" USER="$user_name" LOGNAME="$user_name" LANG=C.UTF-8 TERM=dumb
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
[ "${CI:-}" = true ] && inner_env+=(CI=true)
# One compile cache per user (newcomer's files would not be root's to write, and back).
ccache_dir="" ccache_src="$cache/ccache-$user_name"
if [ "$use_ccache" = 1 ]; then
  ccache_dir="$root$user_home/.cache/ccache"
  mkdir -p "$ccache_dir" "$ccache_src"
  chown "${user_spec%%:*}:${user_spec##*:}" "$ccache_src"
  chown "${user_spec%%:*}:${user_spec##*:}" "$root$user_home/.cache" "$ccache_dir"
fi
# Runs as the namespace's first process: mounts, then the command in the chroot.
# shellcheck disable=SC2016
inside='set -e
root="$1" archives="$2" ccache_src="$3" ccache_dir="$4" user_spec="$5"
shift 5
mount -t proc proc "$root/proc"
echo fresh-debian >/proc/sys/kernel/hostname
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
mount --bind "$archives" "$root/var/cache/apt/archives"
[ -z "$ccache_dir" ] || mount --bind "$ccache_src" "$ccache_dir"
exec chroot --userspec="$user_spec" "$root" env -i "$@" bash /fresh-machine-command.sh'
echo "fresh-machine: $mode: commit ${sha:0:12} in $root, as $user_name: make $target $make_args"
echo "fresh-machine: log: $log"
start=$(date +%s)
set +e
# --kill-child: if this script dies, the namespace's first process (and so all of it) dies too.
unshare --mount --pid --uts --fork --kill-child --propagation private bash -c "$inside" fresh-machine \
  "$root" "$cache/apt-archives" "$ccache_src" "$ccache_dir" "$user_spec" "${inner_env[@]}" \
  </dev/null >"$log" 2>&1 &
child=$!
set -e
status=""
last_report=$start
while kill -0 "$child" 2>/dev/null; do
  sleep 5
  now=$(date +%s)
  if [ "$timeout_s" -gt 0 ] && [ $((now - start)) -ge "$timeout_s" ]; then
    echo "fresh-machine: timeout after ${timeout_s} s; stopping"
    kill -KILL "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
    status=124
    break
  fi
  if [ $((now - last_report)) -ge 60 ]; then
    last_report=$now
    newest="$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-110)"
    printf 'fresh-machine: %dm%02ds  %s\n' $(((now - start) / 60)) $(((now - start) % 60)) "$newest"
  fi
done
if [ -z "$status" ]; then
  set +e
  wait "$child"
  status=$?
  set -e
fi
elapsed=$(($(date +%s) - start))

# ---- 4. the report ------------------------------------------------------------------
echo "fresh-machine: ---- last $lines lines of $log"
tail -n "$lines" "$log"
echo "fresh-machine: ----"
printf 'fresh-machine: %s (make %s) on a fresh Debian 12 root, commit %s: exit %d after %dm%02ds\n' \
  "$mode" "$target" "${sha:0:12}" "$status" $((elapsed / 60)) $((elapsed % 60))
[ "$keep" = 1 ] && echo "fresh-machine: the root is kept: $root"
exit "$status"
