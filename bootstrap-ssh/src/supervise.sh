# The supervisor of one command (see supervisor.rs): POSIX sh, coreutils or busybox.
# Arguments: run directory, run key, bytes of output to keep, token, client epoch,
# command, and "env" when the environment script follows on stdin.
R=$1 k=$2 m=$3 T=$4 now=$5 c=$6 e=
f=$R/$k
# Each stream ends with a line behind the token (stderr's says how the run ended):
# the client has everything once it has both (sudo keeps the session's output open).
say() { printf '\n%s out\n' "$T"; printf '\n%s %s\n' "$T" "$*" >&2; }
fail() { say "error $*"; exec >&- 2>&-; exit 0; }
nap() { sleep 0.2 2>/dev/null || sleep 1; }
# Secret environment: export lines up to the token line, kept in memory only.
if [ "$7" = env ]; then
  while IFS= read -r l; do [ "$l" = "$T" ] && break; e="$e$l
"; done
fi
umask 077
if ! [ -d "$R" ]; then
  o=$(mkdir -p -m 700 -- "$R" 2>&1) || fail "cannot make the run directory $R: $o"
fi
[ -d "$R" ] && ! [ -L "$R" ] && [ -O "$R" ] || fail "the run directory $R is a link or another user's: remove it"
B=-
[ -r /proc/sys/kernel/random/boot_id ] && read -r B < /proc/sys/kernel/random/boot_id
# P_STATE, P_PGRP, P_START of process $1 (start time tells a reused pid apart).
info() {
  P_STATE= P_PGRP= P_START=-
  if [ -d /proc/self ]; then
    read -r s 2>/dev/null < "/proc/$1/stat" || return 1
    set -- ${s##*) }
    P_STATE=$1 P_PGRP=$3 P_START=${20}
  else
    kill -0 "$1" 2>/dev/null || return 1
    P_PGRP=$(ps -o pgid= -p "$1" 2>/dev/null) || return 1
    P_PGRP=${P_PGRP##* }
  fi
}
alive() { [ "$3" = "$B" ] && info "$1" && [ "$P_STATE" != Z ] && [ "$P_START" = "$2" ]; }
gone() { rm -f -- "$f.run" "$f.out" "$f.err" "$f.rc" "$f.st" "$@"; }
others() { for w in "$f".w*; do [ -e "$w" ] && [ "$w" != "$f.w$$" ] && return 0; done; return 1; }
# Output, then the status line, then end of output; the records go once the client
# says it has them all (a cut before that leaves them for the next run of the key).
deliver() {
  [ -s "$f.out" ] && cat -- "$f.out"
  [ -s "$f.err" ] && cat -- "$f.err" >&2
  st=; read -r st 2>/dev/null < "$f.rc"
  read -r r0 2>/dev/null < "$f.run"
  say "exit $st $1"
  exec >&- 2>&-
  if IFS= read -r a && [ "$a" = ok ]; then
    r1=; read -r r1 2>/dev/null < "$f.run"
    if [ "$r1" = "$r0" ] && ! others; then gone ${seen:+"$f.w$$"}; elif [ -n "$seen" ]; then rm -f -- "$f.w$$"; fi
  fi
  exit 0
}
info $$ || fail "cannot read this shell's own process record"
self="$$ $P_START $B $P_PGRP $now"
seen= how=ran n=0
while :; do
  [ -n "$seen" ] && ! [ -e "$f.run" ] && fail "lost the run it waited for ended, and another client collected its outcome"
  # noclobber: O_EXCL, so of two supervisors of one key exactly one runs it.
  set -C
  if { printf '%s\n' "$self" > "$f.run"; } 2>/dev/null; then set +C; break; fi
  set +C
  r=; read -r r 2>/dev/null < "$f.run"
  if [ -z "$r" ]; then
    # Being written this instant, or a record a full disk left empty.
    n=$((n+1))
    if [ $n -gt 5 ]; then
      rm -f -- "$f.run"
      o=$({ printf '%s\n' "$self" > "$f.run"; } 2>&1); rm -f -- "$f.run"
      fail "cannot record the run in $R: ${o:-the record stays empty}"
    fi
    nap; continue
  fi
  set -- $r
  if [ -e "$f.st" ]; then
    # Finished, its outcome not collected: this boot's, and recent, is handed over.
    if [ -n "$seen" ] || { [ "$3" = "$B" ] && [ $((now - $5)) -lt 3600 ]; }; then deliver "${seen:-adopted}"; fi
    gone; continue
  fi
  if alive "$1" "$2" "$3"; then
    seen=waited
    { printf '' > "$f.w$$"; } 2>/dev/null
    while [ ! -e "$f.st" ] && alive "$1" "$2" "$3"; do nap; done
    continue
  fi
  [ -n "$seen" ] && fail "lost the run it waited for ended without an outcome (killed, or the machine restarted)"
  if [ "$3" != "$B" ]; then how="rerun:the machine restarted during the previous run"; else how="rerun:the previous run's supervisor died"; fi
  gone
done
# The status goes over a placeholder written now (1<> does not truncate), and the
# end is an empty file: neither needs a block a full disk no longer has.
{ printf '%s\n' ---- > "$f.rc"; } 2>/dev/null || { gone; fail "cannot record the run in $R (is its filesystem full?)"; }
# stdout and stderr each through tail -c: the logs hold at most $m bytes whatever the
# command prints, and a full disk fails the log, never the command's writes.
{ { ( [ -n "$e" ] && eval "$e"; exec sh -c "$c" ); printf '%s\n' "$?" 1<> "$f.rc"; } </dev/null 2>&1 >&3 3>&- | tail -c "$m" > "$f.err" 2>/dev/null; } 3>&1 | tail -c "$m" > "$f.out" 2>/dev/null
lf=$?
rc=; read -r rc 2>/dev/null < "$f.rc"
case $rc in ''|*[!0-9]*) gone; fail "the command ran, but its exit status could not be recorded in $R" ;; esac
{ printf '' > "$f.st"; } 2>/dev/null || { gone; fail "the command ran (status $rc), but its end could not be recorded in $R"; }
[ $lf = 0 ] || how="$how,log-incomplete"
deliver "$how"
