#!/usr/bin/env bash
# A stand-in worker for the supervisor tests. FAKE_PLAN lists one action per attempt
# (TESSERA_ATTEMPT picks it; the last one repeats): ok, exitN, kill, hang, stop, earlyN. The
# rank FAKE_RANK (default 0) performs it after heartbeating steps 1..3 (earlyN: exits N
# before any heartbeat, a crash loop); the other ranks keep heartbeating until stopped
# (or finish with ok). FAKE_PIDS collects every worker's pid. While it hangs, SIGUSR1 or
# a <heartbeat>.stacks-request file makes it write "fake stacks" to stderr and touch
# <heartbeat>.stacks, as tessera train does; FAKE_ASKED collects how it was asked
# ("signal" or "file"). FAKE_HOST replaces the host its heartbeat names.
set -u
read -r -a plan <<<"${FAKE_PLAN:-ok}"
attempt="${TESSERA_ATTEMPT:-0}"
action="${plan[$((attempt < ${#plan[@]} ? attempt : ${#plan[@]} - 1))]}"
[[ -n "${FAKE_PIDS:-}" ]] && echo "$$" >>"$FAKE_PIDS"
# FAKE_ENV collects "RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GOODPUT_DIR" of every
# worker, as the launcher set them.
[[ -n "${FAKE_ENV:-}" ]] && echo "${TESSERA_RANK:-} ${TESSERA_WORLD_SIZE:-} ${TESSERA_LOCAL_RANK:-}" \
  "${TESSERA_LOCAL_WORLD_SIZE:-} ${TESSERA_GOODPUT_DIR:-}" >>"$FAKE_ENV"
# FAKE_BEAT_TIME replaces the heartbeat's time (JSON text, e.g. '"soon"': a damaged beat).
beat() {
  printf '{"step":%d,"time":%s,"pid":%d,"host":"%s"}\n' "$1" "${FAKE_BEAT_TIME:-$(date +%s.%N)}" "$$" \
    "${FAKE_HOST:-$(hostname)}" >"$TESSERA_HEARTBEAT_FILE.tmp"
  mv -f "$TESSERA_HEARTBEAT_FILE.tmp" "$TESSERA_HEARTBEAT_FILE"
}
if [[ "$action" == early* && "${TESSERA_RANK:-0}" == "${FAKE_RANK:-0}" ]]; then
  exit "${action#early}"
fi
if [[ "$action" != ok && "${TESSERA_RANK:-0}" != "${FAKE_RANK:-0}" ]]; then
  for ((step = 1; ; ++step)); do beat "$step"; sleep 0.05; done
fi
for step in 1 2 3; do beat "$step"; sleep 0.05; done
case "$action" in
  ok) exit 0 ;;
  exit*) exit "${action#exit}" ;;
  kill) kill -KILL $$ ;;
  stop) kill -STOP $$ ;;
  hang)
    answer() {
      echo "fake stacks" >&2
      [[ -n "${FAKE_ASKED:-}" ]] && echo "$1" >>"$FAKE_ASKED"
      touch "$TESSERA_HEARTBEAT_FILE.stacks"
    }
    trap 'answer signal' USR1
    while true; do
      sleep 0.05 &
      wait $!
      if rm "$TESSERA_HEARTBEAT_FILE.stacks-request" 2>/dev/null; then answer file; fi
    done
    ;;
esac
echo "fake_worker: unknown action '$action'" >&2
exit 99
