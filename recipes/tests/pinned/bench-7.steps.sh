#!/bin/sh
# machine-core step layer "base": 16 steps
set -eu
state=/var/lib/machine-core/layers/base.done
mkdir -p "$(dirname "$state")"
touch "$state"
# step 1: run sh -ec '[ "$(cat /etc/hostname 2>/dev/null)" = web-7 ] || printf '\''%s\n'\'' web-7 > /etc/hostname
if ! grep -qx 941f615fa1d37277b514822c79a64bc6 "$state"; then
  sh -c "sh -ec '[ \""'$(cat /etc/hostname 2>/dev/null)" = web-7 ] || printf '"'\\''%s\\n'\\'' web-7 > /etc/hostname
[ \""'$(hostname)" = web-7 ] || hostname web-7
'"'"
  echo 941f615fa1d37277b514822c79a64bc6 >> "$state"
fi
# step 2: run sh -ec '[ -f /usr/share/zoneinfo/Europe/Paris ] || { echo '\''no time zone Europe/Paris in /usr/share/zoneinfo'\'' >&2; exit 1; }
if ! grep -qx 587211c85e8a990d31f91bc7484de4a4 "$state"; then
  sh -c "sh -ec '[ -f /usr/share/zoneinfo/Europe/Paris ] || { echo '\\''no time zone Europe/Paris in /usr/share/zoneinfo'\\'' >&2; exit 1; }
[ \""'$(cat /etc/timezone 2>/dev/null)" = Europe/Paris ] || printf '"'\\''%s\\n'\\'' Europe/Paris > /etc/timezone
if [ -L /etc/localtime ] || [ "'! -e /etc/localtime ]; then [ "$(readlink /etc/localtime)" = /usr/share/zoneinfo/Europe/Paris ] || ln -sfn /usr/share/zoneinfo/Europe/Paris /etc/localtime; else cmp -s /usr/share/zoneinfo/Europe/Paris /etc/localtime || cp /usr/share/zoneinfo/Europe/Paris /etc/localtime; fi
'"'"
  echo 587211c85e8a990d31f91bc7484de4a4 >> "$state"
fi
# step 3: run sh -ec 'getent group deploy >/dev/null || groupadd deploy
if ! grep -qx 72bc1357a245dab360889231a3a530b4 "$state"; then
  sh -c "sh -ec 'getent group deploy >/dev/null || groupadd deploy
getent passwd ops >/dev/null || useradd ops --groups deploy --shell /bin/bash -m
case \""'$(passwd -S ops 2>/dev/null | cut -d'"'\\'' '\\'' -f2)\" in L|LK) ;; *) passwd -l ops >/dev/null ;; esac
d=\""'$(getent passwd ops | cut -d: -f6)/.ssh"
if [ ! -d "$d" ]; then mkdir -p "$d"; chmod 700 "$d"; chown ops: "$d"; fi
f="$d/authorized_keys"
if [ ! -e "$f" ]; then : > "$f"; chmod 600 "$f"; chown ops: "$f"; fi
grep -qxF -- '"'\\''ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop'\\'' \""'$f" || printf '"'\\''%s\\n'\\'' '\\''ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop'\\'' >> \""'$f"
'"'"
  echo 72bc1357a245dab360889231a3a530b4 >> "$state"
fi
# step 4: run sh -ec 'command -v apt-get >/dev/null || { echo '\''apt-get not found: these packages are for the apt family'\'' >&2; exit 1; }
if ! grep -qx ad5a47df930edc0d18bac27a689e3902 "$state"; then
  sh -c "sh -ec 'command -v apt-get >/dev/null || { echo '\\''apt-get not found: these packages are for the apt family'\\'' >&2; exit 1; }
if "'! { dpkg-query -W -f='"'\\''"'${db:Status-Abbrev}${Version}'"\\n'\\'' nginx 2>/dev/null | grep -qxF '\\''ii 1.22.1-9'\\'' && dpkg-query -W -f='\\''"'${db:Status-Abbrev}${Version}'"\\n'\\'' curl 2>/dev/null | grep -q '\\''"'^ii'"'\\''; }; then
  export DEBIAN_FRONTEND=noninteractive
  w=; if command -v eatmydata >/dev/null; then w=eatmydata; fi
  "'$w apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet update
  $w apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet install nginx=1.22.1-9 curl
fi
'"'"
  echo ad5a47df930edc0d18bac27a689e3902 >> "$state"
fi
# step 5: write /etc/app/app.conf
if ! grep -qx 65213de25e7285541af84e8f13efb58a "$state"; then
  mkdir -p "$(dirname /etc/app/app.conf)"
  printf '%s' 'cG9ydCA9IDgwODAKaWQgPSA3Cg==' | base64 -d > /etc/app/app.conf.machine-core-tmp
  chmod 640 /etc/app/app.conf.machine-core-tmp
  mv -f /etc/app/app.conf.machine-core-tmp /etc/app/app.conf
  echo 65213de25e7285541af84e8f13efb58a >> "$state"
fi
# step 6: run find /etc/app/app.conf -maxdepth 0 -user ops -group deploy 2>/dev/null | grep -q . || chown ops:deploy /etc/app/app.conf # file 65b86fa74b012fb4
if ! grep -qx 50afebee2bbcbb45747cc78349870871 "$state"; then
  sh -c 'find /etc/app/app.conf -maxdepth 0 -user ops -group deploy 2>/dev/null | grep -q . || chown ops:deploy /etc/app/app.conf # file 65b86fa74b012fb4'
  echo 50afebee2bbcbb45747cc78349870871 >> "$state"
fi
# step 7: write /etc/systemd/system/app.service
if ! grep -qx baf06b2299612dcf3cfe53dd0f23ec8e "$state"; then
  mkdir -p "$(dirname /etc/systemd/system/app.service)"
  printf '%s' 'W1NlcnZpY2VdCkV4ZWNTdGFydD0vdXNyL2Jpbi9hcHAKW0luc3RhbGxdCldhbnRlZEJ5PW11bHRpLXVzZXIudGFyZ2V0Cg==' | base64 -d > /etc/systemd/system/app.service.machine-core-tmp
  chmod 644 /etc/systemd/system/app.service.machine-core-tmp
  mv -f /etc/systemd/system/app.service.machine-core-tmp /etc/systemd/system/app.service
  echo baf06b2299612dcf3cfe53dd0f23ec8e >> "$state"
fi
# step 8: write /etc/systemd/system/app.service.d/limits.conf
if ! grep -qx 82dfce2d50910f2755a555f406c6351e "$state"; then
  mkdir -p "$(dirname /etc/systemd/system/app.service.d/limits.conf)"
  printf '%s' 'W1NlcnZpY2VdCkxpbWl0Tk9GSUxFPTY1NTM2Cg==' | base64 -d > /etc/systemd/system/app.service.d/limits.conf.machine-core-tmp
  chmod 644 /etc/systemd/system/app.service.d/limits.conf.machine-core-tmp
  mv -f /etc/systemd/system/app.service.d/limits.conf.machine-core-tmp /etc/systemd/system/app.service.d/limits.conf
  echo 82dfce2d50910f2755a555f406c6351e >> "$state"
fi
# step 9: write /etc/sysctl.d/90-app.conf
if ! grep -qx 76b4b60796ef71725e849eaffc71a818 "$state"; then
  mkdir -p "$(dirname /etc/sysctl.d/90-app.conf)"
  printf '%s' 'bmV0LmlwdjQuaXBfZm9yd2FyZCA9IDEK' | base64 -d > /etc/sysctl.d/90-app.conf.machine-core-tmp
  chmod 644 /etc/sysctl.d/90-app.conf.machine-core-tmp
  mv -f /etc/sysctl.d/90-app.conf.machine-core-tmp /etc/sysctl.d/90-app.conf
  echo 76b4b60796ef71725e849eaffc71a818 >> "$state"
fi
# step 10: write /etc/modules-load.d/app.conf
if ! grep -qx 52b8fc69589e25d28f5c88a2d50cf52e "$state"; then
  mkdir -p "$(dirname /etc/modules-load.d/app.conf)"
  printf '%s' 'b3ZlcmxheQpicl9uZXRmaWx0ZXIK' | base64 -d > /etc/modules-load.d/app.conf.machine-core-tmp
  chmod 644 /etc/modules-load.d/app.conf.machine-core-tmp
  mv -f /etc/modules-load.d/app.conf.machine-core-tmp /etc/modules-load.d/app.conf
  echo 52b8fc69589e25d28f5c88a2d50cf52e >> "$state"
fi
# step 11: run sh -ec 'if [ "$(stat -c %a /etc/sudoers.d/90-recipes-ops 2>/dev/null)" = 440 ] && printf '\''%s\n'\'' '\''ops ALL=(ALL) NOPASSWD:ALL'\'' | cmp -s - /etc/sudoers.d/90-recipes-ops; then exit 0; fi
if ! grep -qx 02a73a57ac8cc1a6eb8b595a2b5e29e3 "$state"; then
  sh -c "sh -ec 'if [ \""'$(stat -c %a /etc/sudoers.d/90-recipes-ops 2>/dev/null)" = 440 ] && printf '"'\\''%s\\n'\\'' '\\''ops ALL=(ALL) NOPASSWD:ALL'\\'' | cmp -s - /etc/sudoers.d/90-recipes-ops; then exit 0; fi
command -v visudo >/dev/null || { printf '\\''%s: visudo not found: the sudo rule cannot be checked (install sudo first)\\n'\\'' '\\''layer base.recipes[2].sudo'\\'' >&2; exit 1; }
mkdir -p /etc/sudoers.d
printf '\\''%s\\n'\\'' '\\''ops ALL=(ALL) NOPASSWD:ALL'\\'' > /etc/sudoers.d/90-recipes-ops.recipes-new
chmod 0440 /etc/sudoers.d/90-recipes-ops.recipes-new
if "'! out=$(visudo -cf /etc/sudoers.d/90-recipes-ops.recipes-new 2>&1); then
  rm -f /etc/sudoers.d/90-recipes-ops.recipes-new
  printf '"'\\''%s: visudo refuses the sudo rule (%s left as it was): %s\\n'\\'' '\\''layer base.recipes[2].sudo'\\'' /etc/sudoers.d/90-recipes-ops \""'$out" >&2
  exit 1
fi
mv -f /etc/sudoers.d/90-recipes-ops.recipes-new /etc/sudoers.d/90-recipes-ops
'"'"
  echo 02a73a57ac8cc1a6eb8b595a2b5e29e3 >> "$state"
fi
# step 12: run sh -ec 'mkdir -p /srv/app
if ! grep -qx fddc70bace8a15d08a447ed4029e386b "$state"; then
  sh -c "sh -ec 'mkdir -p /srv/app
find /srv/app -maxdepth 0 -user ops 2>/dev/null | grep -q . || chown ops /srv/app
[ \""'$(stat -c %a /srv/app)" = 755 ] || chmod 0755 /srv/app
'"'"
  echo fddc70bace8a15d08a447ed4029e386b >> "$state"
fi
# step 13: run sh -ec 'f=/etc/motd
if ! grep -qx bc1f7ceb45292a656eb63a0043944cf2 "$state"; then
  sh -c "sh -ec 'f=/etc/motd
l='\\''machine 7'\\''
[ -e \""'$f" ] || : > "$f"
if ! grep -qxF -- "$l" "$f"; then
  if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >> "$f"; fi
  printf '"'\\''%s\\n'\\'' \""'$l" >> "$f"
fi
'"'"
  echo bc1f7ceb45292a656eb63a0043944cf2 >> "$state"
fi
# step 14: run sh -ec 'mkdir -p /etc/systemd/system/multi-user.target.wants
if ! grep -qx 5dc86999ad26c88ff14a18ca6bdab6b2 "$state"; then
  sh -c "sh -ec 'mkdir -p /etc/systemd/system/multi-user.target.wants
[ \""'$(readlink /etc/systemd/system/multi-user.target.wants/app.service)" = /etc/systemd/system/app.service ] || ln -sfn /etc/systemd/system/app.service /etc/systemd/system/multi-user.target.wants/app.service
# files 2e3bdf870c8cdd82
if [ -d /run/systemd/system ]; then systemctl daemon-reload; systemctl restart app.service; fi
'"'"
  echo 5dc86999ad26c88ff14a18ca6bdab6b2 >> "$state"
fi
# step 15: run sh -ec '# content 8ae2b0f4fb7ede7f
if ! grep -qx 90490c724a016b32caf8fb461dffe323 "$state"; then
  sh -c "sh -ec '# content 8ae2b0f4fb7ede7f
sysctl -q -p /etc/sysctl.d/90-app.conf
'"
  echo 90490c724a016b32caf8fb461dffe323 >> "$state"
fi
# step 16: run sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
if ! grep -qx c2dde35c5286c6bc49b6c9a3da688bcb "$state"; then
  sh -c "sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
[ -d /sys/module/br_netfilter ] || modprobe br_netfilter
'"
  echo c2dde35c5286c6bc49b6c9a3da688bcb >> "$state"
fi
