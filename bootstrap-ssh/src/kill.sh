# Kills the process group of a supervised run (see supervisor.rs) and says what it did:
# "killed G pid:name...", "left G pid:name..." (still running), or "finished", "gone",
# "dead" (nothing to kill). Arguments: run directory, run key.
R=$1 k=$2 f=$1/$2
nap() { sleep 0.1 2>/dev/null || sleep 1; }
B=-
[ -r /proc/sys/kernel/random/boot_id ] && read -r B < /proc/sys/kernel/random/boot_id
r=; read -r r 2>/dev/null < "$f.run"
[ -n "$r" ] || { echo gone; exit 0; }
set -- $r
pid=$1 start=$2 boot=$3 g=$4
[ -e "$f.st" ] && { echo finished; exit 0; }
case $g in ''|*[!0-9]*) echo dead; exit 0 ;; esac
if [ -d /proc/self ]; then
  # Only the supervisor that wrote the record: a reused pid is someone else's.
  s=; read -r s 2>/dev/null < "/proc/$pid/stat"
  set -- ${s##*) }
  { [ "$boot" = "$B" ] && [ -n "$s" ] && [ "$1" != Z ] && [ "${20}" = "$start" ]; } || { echo dead; exit 0; }
  members() {
    list= cnt=0
    for p in /proc/[0-9]*; do
      s=; read -r s 2>/dev/null < "$p/stat" || continue
      n=${s#*(}; n=${n%)*}
      set -- ${s##*) }
      [ "$3" = "$g" ] && [ "$1" != Z ] && { list="$list ${p#/proc/}:$n"; cnt=$((cnt+1)); }
    done
  }
else
  kill -0 "$pid" 2>/dev/null || { echo dead; exit 0; }
  members() { if kill -0 "-$g" 2>/dev/null; then cnt=1 list=" ?"; else cnt=0 list=; fi; }
fi
members
before=$list
kill -KILL "-$g" 2>/dev/null
i=0
while members; [ "$cnt" -gt 0 ] && [ $i -lt 50 ]; do nap; i=$((i+1)); done
if [ "$cnt" = 0 ]; then
  rm -f -- "$f.run" "$f.out" "$f.err" "$f.rc" "$f.st" "$f.w"
  # The runs its supervisor had collected are left: the next supervisor removes them.
  { : > "$R/.sweep"; } 2>/dev/null
  echo "killed $g$before"
else
  echo "left $g$list"
fi
