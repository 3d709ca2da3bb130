# The supervisor of a connection's work (see supervisor.rs): POSIX sh, coreutils or
# busybox. It serves one channel for as long as the connection lives, taking requests
# on stdin one at a time, each in a subshell of its own: the session, the login shell
# and this shell are paid once per channel instead of once per command.
# Argument: the run directory.
# A request is a line "run|put|get TOKEN ARGS... N" and N lines of shell assignments
# (quoted by the client). Each answer ends both streams with a line behind TOKEN
# (stderr's says how it ended): the client has everything once it has both.
R=$1
# Commands run with the login's umask; the records are private.
U=$(umask)
umask 077
say() { printf '\n%s out\n' "$T"; printf '\n%s %s\n' "$T" "$*" >&2; }
fail() { say "error $*"; exit 0; }
nap() { sleep 0.2 2>/dev/null || sleep 1; }
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
# This shell's record "pid start boot pgrp": the runs it supervises are recorded as
# its own (one at a time), and so is their process group.
A=
info $$ && A="$$ $P_START $B $P_PGRP"
# The run directory: private, ours, made when missing (a restart empties /run).
rundir() {
  if ! [ -d "$R" ]; then
    o=$(mkdir -p -m 700 -- "$R" 2>&1) || fail "cannot make the run directory $R: $o"
  fi
  [ -d "$R" ] && ! [ -L "$R" ] && [ -O "$R" ] || fail "the run directory $R is a link or another user's: remove it"
}
# The record last: until it goes, nobody else takes the key.
gone() { rm -f -- "$f.out" "$f.err" "$f.rc" "$f.st" "$f.w" "$@" "$f.run" 2>/dev/null; }
# Other clients waiting for this run: each has a file $f.w<pid>, and $f.w says there
# are some, so that a run without waiters never reads the run directory.
others() {
  [ -e "$f.w" ] || return 1
  for w in "$f".w?*; do [ -e "$w" ] && [ "$w" != "$f.w$$" ] && return 0; done; return 1
}
# Removes the records of the collected runs (those with $f.ok) of the keys in $1, in
# one rm. A key is taken under its lock $f.t (noclobber), which holds its holder's
# record; a lock whose holder died is removed. The end goes first and the record, the
# collected mark and the lock last, so nobody sees a finished run left uncollected,
# and a new run of the key starts only once its old files are gone.
sweep() {
  ks=$1
  set --
  for k in $ks; do
    f=$R/$k
    [ -e "$f.ok" ] || continue
    set -C
    if ! { printf '%s\n' "$A" > "$f.t"; } 2>/dev/null; then
      set +C
      t=; read -r t 2>/dev/null < "$f.t"
      [ -n "$t" ] && ! alive $t && set -- "$@" "$f.t"
      continue
    fi
    set +C
    [ -e "$f.ok" ] || { set -- "$@" "$f.t"; continue; }
    set -- "$@" "$f.st" "$f.rc" "$f.out" "$f.err"
    if [ -e "$f.w" ]; then for w in "$f".w?*; do [ -e "$w" ] && set -- "$@" "$w"; done; fi
    set -- "$@" "$f.w" "$f.run" "$f.ok" "$f.t"
  done
  [ $# = 0 ] || rm -f -- "$@" 2>/dev/null
}
# Output, then the status line. Once the client says it has it all, the run is marked
# collected ($f.ok, naming this agent: a builtin's write, where removing the records
# takes a process; this agent removes them when it ends, or the next run of the key
# does; status 3 tells the agent), then "done". A cut before that leaves the run for
# the next run of the key.
deliver() {
  [ -s "$f.out" ] && cat -- "$f.out"
  [ -s "$f.err" ] && cat -- "$f.err" >&2
  st=; read -r st 2>/dev/null < "$f.rc"
  read -r r0 2>/dev/null < "$f.run"
  say "exit $st $1"
  IFS= read -r a && [ "$a" = ok ] || exit 1
  r1=; read -r r1 2>/dev/null < "$f.run"
  s=0
  if [ "$r1" = "$r0" ] && ! others; then
    # The logs are emptied at once (truncation is a builtin's too): only empty files
    # wait for the removal.
    if { printf '%s\n' "$A" > "$f.ok"; } 2>/dev/null; then s=3; : > "$f.out"; : > "$f.err"; else gone ${seen:+"$f.w$$"}; fi
  elif [ -n "$seen" ]; then
    rm -f -- "$f.w$$" 2>/dev/null
  fi
  printf '\n%s done\n' "$T"
  exit $s
}
# run: the command $c (export lines $e first) as run $k, keeping $m bytes of each stream.
run() {
  rundir
  [ -n "$A" ] || fail "cannot read this shell's own process record"
  f=$R/$k self="$A $now" seen= how=ran n=0
  while :; do
    [ -n "$seen" ] && { ! [ -e "$f.run" ] || [ -e "$f.ok" ]; } && fail "lost the run it waited for ended, and another client collected its outcome"
    # noclobber: O_EXCL, so of two supervisors of one key exactly one runs it.
    set -C
    if { printf '%s\n' "$self" > "$f.run"; } 2>/dev/null; then set +C; break; fi
    set +C
    if [ -e "$f.ok" ]; then
      # Collected: its records go, then the key is free.
      sweep "$k"; f=$R/$k
      [ -e "$f.ok" ] && nap
      continue
    fi
    r=; read -r r 2>/dev/null < "$f.run"
    if [ -z "$r" ]; then
      # Being written this instant, or a record a full disk left empty.
      n=$((n+1))
      if [ $n -gt 5 ]; then
        rm -f -- "$f.run" 2>/dev/null
        o=$({ printf '%s\n' "$self" > "$f.run"; } 2>&1); rm -f -- "$f.run" 2>/dev/null
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
      { printf '' > "$f.w$$"; printf '' > "$f.w"; } 2>/dev/null
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
  { { ( umask "$U"; [ -n "$e" ] && eval "$e"; exec sh -c "$c" ); printf '%s\n' "$?" 1<> "$f.rc"; } </dev/null 2>&1 >&3 3>&- | tail -c "$m" > "$f.err" 2>/dev/null; } 3>&1 | tail -c "$m" > "$f.out" 2>/dev/null
  lf=$?
  rc=; read -r rc 2>/dev/null < "$f.rc"
  case $rc in ''|*[!0-9]*) gone; fail "the command ran, but its exit status could not be recorded in $R" ;; esac
  { printf '' > "$f.st"; } 2>/dev/null || { gone; fail "the command ran (status $rc), but its end could not be recorded in $R"; }
  [ $lf = 0 ] || how="$how,log-incomplete"
  deliver "$how"
}
# put: $n bytes of stdin into the file $b of directory $p, as $me_ (see upload.rs).
put() {
  fail() { printf '%s\n' "$*" >&2; exit 1; }
  enter() {
    cd -P -- "$1" 2>/dev/null && return 0
    [ -x "$1" ] || fail "cannot enter $D/$1: Permission denied"
    fail "cannot enter $D/$1"
  }
  # Directories made on the way get the login's umask, as a plain mkdir -p would.
  umask "$U"
  cd /
  D=
  r=${p#/}
  while [ -n "$r" ]; do
    c=${r%%/*}
    case $r in */*) r=${r#*/} ;; *) r= ;; esac
    case $c in ''|.) continue ;; esac
    if [ -L "$c" ]; then
      set -- $(ls -ld -- "$c")
      [ "$3" = root ] || [ "$3" = "$me_" ] || fail "refused: $D/$c is a symbolic link owned by $3, not by root or $me_: it could point the upload anywhere"
      enter "$c"
    else
      o=
      [ -e "$c" ] || o=$(mkdir -- "$c" 2>&1) || [ -d "$c" ] || fail "cannot make the directory $D/$c: $o"
      [ -d "$c" ] || fail "$D/$c is not a directory"
      enter "$c"
      [ "$PWD" = "$D/$c" ] || fail "refused: $D/$c turned into a link to $PWD while the path was resolved"
    fi
    D=$PWD
  done
  [ -n "$D" ] || D=/
  up() {
    kill -0 "$1" 2>/dev/null || return 1
    s=; read -r s 2>/dev/null < "/proc/$1/stat" || return 0
    s=${s##*) }
    [ "${s%% *}" != Z ]
  }
  for x in ."$b".bssh-*; do
    { [ -d "$x" ] || [ -f "$x" ]; } && [ ! -L "$x" ] && [ -O "$x" ] || continue
    o=${x#."$b".bssh-}; o=${o%%.*}
    up "$o" || rm -rf -- "$x" 2>/dev/null || true
  done
  t=".$b.bssh-$$.$tok"
  if [ -e "$t" ] || [ -L "$t" ]; then fail "the upload's temporary name $D/$t is taken"; fi
  g=
  if [ -z "$own$mo" ]; then
    # Nothing is done by name between the write and the rename: the temporary file
    # sits beside the target (made new by noclobber, its name holding the client's
    # random token: nobody can plant anything there first), written through the
    # descriptor the shell opened, then renamed (a rename never follows a link).
    trap '[ -z "$g" ] || rm -f -- "$g"' EXIT
    trap 'exit 1' HUP INT TERM PIPE
    g=$t f=$b
  else
    # chown and chmod go by name: the file is made in a private directory first.
    umask 077
    mkdir -m 700 -- "$t" || fail "cannot make the private upload directory $D/$t"
    trap 'cd / && { [ -z "$g" ] || rm -f -- "$D/$t/$g"; rmdir -- "$D/$t" 2>/dev/null || true; }' EXIT
    trap 'exit 1' HUP INT TERM PIPE
    cd -P -- "$t"
    [ "$PWD" = "${D%/}/$t" ] && [ -O . ] || fail "the private upload directory $D/$t was replaced by another user"
    g=data f=../$b
  fi
  umask "$um"
  set -C
  head -c "$n" > "$g" || fail "cannot write $D/$t"
  set +C
  # head stops early only at the end of input (the channel closed): the line that
  # follows the content, asked for now, proves it all came.
  printf '\n%s more\n' "$T"
  IFS= read -r z || z=
  if [ "$z" != "$T" ]; then echo "the content did not arrive whole: its input ended early" >&2; exit 97; fi
  [ -z "$own" ] || chown -- "$own" "$g"
  [ -z "$mo" ] || chmod "$mo" "$g"
  mv -fT -- "$g" "$f"
  g=
}
# get: the file $p, unless it holds more than $max bytes.
get() {
  [ -e "$p" ] || exit 96
  s=$(wc -c < "$p") || exit 1
  if [ "$s" -gt "$max" ]; then echo "$s bytes" >&2; exit 95; fi
  exec cat -- "$p"
}
# Collected runs of an agent that was killed (a timeout kills its process group)
# are removed by the next agent, when the killer left word ($R/.sweep): their mark
# names a dead agent. Without the word the run directory is not read.
if [ -e "$R/.sweep" ] && ! [ -L "$R" ] && [ -O "$R" ]; then
  rm -f -- "$R/.sweep" 2>/dev/null
  K=
  for x in "$R"/*.ok; do
    [ -e "$x" ] || continue
    o=; read -r o 2>/dev/null < "$x"
    [ -n "$o" ] && alive $o && continue
    x=${x##*/}; K="$K ${x%.ok}"
  done
  [ -z "$K" ] || sweep "$K"
fi
# The keys of the runs this agent collected: removed when it ends.
K=
while IFS= read -r h; do
  set -- $h
  [ $# -ge 3 ] || break
  w=$1 T=$2
  # The request's assignments: its last field says how many lines they take.
  eval "i=\${$#}"
  L=
  while [ "$i" -gt 0 ] && IFS= read -r l; do L="$L$l
"; i=$((i-1)); done
  [ "$i" = 0 ] || break
  case $w in
    run)
      k=$3 m=$4 now=$5 c= e=; eval "$L"; ( run ); s=$?
      if [ $s != 3 ] && [ $s != 0 ]; then
        # A run without a step key (u...) is never run again under its key: one its
        # client did not collect (a cut while it delivered) goes now, with its records.
        case $k in u*) f=$R/$k; r=; read -r r 2>/dev/null < "$f.run"; [ "$r" = "$A $now" ] && gone "$f.ok" ;; esac
      fi
      if [ $s = 3 ]; then K="$K $k"
      elif [ $s -ge 128 ]; then
        # Its subshell died: a cut while it delivered (SIGPIPE) leaves a finished run
        # for the next run of the key to take over; one killed by someone before the
        # end leaves no outcome, and its records name this live shell: they go, and
        # the next run of the key runs it again (a timeout kills this shell too).
        f=$R/$k
        if ! [ -e "$f.st" ]; then r=; read -r r 2>/dev/null < "$f.run"; [ "$r" = "$A $now" ] && gone; fi
        say "error lost its supervisor was killed (status $s)"
      fi ;;
    # A failed upload may leave content unread: the shell ends rather than read it as requests.
    put) n=$3 um=$4 own= mo=; eval "$L"; ( set -e; put ); s=$?; say "exit $s"; [ $s = 0 ] || break ;;
    get) max=$3; eval "$L"; ( get ) </dev/null; say "exit $?" ;;
    *) break ;;
  esac
done
[ -z "$K" ] || sweep "$K"
