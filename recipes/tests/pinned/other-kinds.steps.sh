#!/bin/sh
# machine-core step layer "base": 26 steps
set -eu
state=/var/lib/machine-core/layers/base.done
mkdir -p "$(dirname "$state")"
touch "$state"
# step 1: write /etc/apt/keyrings/example.asc
if ! grep -qx 3c6c47200295de0050294039e540ab64 "$state"; then
  mkdir -p "$(dirname /etc/apt/keyrings/example.asc)"
  printf '%s' 'LS0tLS1CRUdJTiBQR1AgUFVCTElDIEtFWSBCTE9DSy0tLS0tCgptRE1FWlhoaGJYQnNaUT09Cj1hYmNkCi0tLS0tRU5EIFBHUCBQVUJMSUMgS0VZIEJMT0NLLS0tLS0K' | base64 -d > /etc/apt/keyrings/example.asc.machine-core-tmp
  chmod 644 /etc/apt/keyrings/example.asc.machine-core-tmp
  mv -f /etc/apt/keyrings/example.asc.machine-core-tmp /etc/apt/keyrings/example.asc
  echo 3c6c47200295de0050294039e540ab64 >> "$state"
fi
# step 2: write /etc/apt/sources.list.d/example.list
if ! grep -qx f86de674cefa39cc35f95493a2c55401 "$state"; then
  mkdir -p "$(dirname /etc/apt/sources.list.d/example.list)"
  printf '%s' 'ZGViIFtzaWduZWQtYnk9L2V0Yy9hcHQva2V5cmluZ3MvZXhhbXBsZS5hc2NdIGh0dHBzOi8vYXB0LmV4YW1wbGUuaW52YWxpZC9kZWJpYW4gYm9va3dvcm0gbWFpbiBjb250cmliCg==' | base64 -d > /etc/apt/sources.list.d/example.list.machine-core-tmp
  chmod 644 /etc/apt/sources.list.d/example.list.machine-core-tmp
  mv -f /etc/apt/sources.list.d/example.list.machine-core-tmp /etc/apt/sources.list.d/example.list
  echo f86de674cefa39cc35f95493a2c55401 >> "$state"
fi
# step 3: run getent group deploy >/dev/null || groupadd deploy
if ! grep -qx 483aee2ded227d3845d63762a5f5234c "$state"; then
  sh -c 'getent group deploy >/dev/null || groupadd deploy'
  echo 483aee2ded227d3845d63762a5f5234c >> "$state"
fi
# step 4: run getent group audit >/dev/null || groupadd audit
if ! grep -qx 2924720831e364c9ea7384a47f70b713 "$state"; then
  sh -c 'getent group audit >/dev/null || groupadd audit'
  echo 2924720831e364c9ea7384a47f70b713 >> "$state"
fi
# step 5: run sh -ec 'getent group deploy >/dev/null || groupadd deploy
if ! grep -qx 0c0a4a98fb18f62c6aa1eaef7ad30fc1 "$state"; then
  sh -c "sh -ec 'getent group deploy >/dev/null || groupadd deploy
getent passwd app >/dev/null || useradd app --comment '\\''App'\\''\\'\\'''\\''s account'\\'' --groups deploy --shell /bin/bash -m
case \""'$(passwd -S app 2>/dev/null | cut -d'"'\\'' '\\'' -f2)\" in L|LK) ;; *) passwd -l app >/dev/null ;; esac
'"
  echo 0c0a4a98fb18f62c6aa1eaef7ad30fc1 >> "$state"
fi
# step 6: run sh -ec 'getent passwd ops >/dev/null || useradd ops --shell /bin/bash -m
if ! grep -qx 831a57f9cadf3e0a395efd459a7a83ef "$state"; then
  sh -c "sh -ec 'getent passwd ops >/dev/null || useradd ops --shell /bin/bash -m
case \""'$(passwd -S ops 2>/dev/null | cut -d'"'\\'' '\\'' -f2)\" in L|LK) ;; *) passwd -l ops >/dev/null ;; esac
d=\""'$(getent passwd ops | cut -d: -f6)/.ssh"
if [ ! -d "$d" ]; then mkdir -p "$d"; chmod 700 "$d"; chown ops: "$d"; fi
f="$d/authorized_keys"
if [ ! -e "$f" ]; then : > "$f"; chmod 600 "$f"; chown ops: "$f"; fi
grep -qxF -- '"'\\''ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop'\\'' \""'$f" || printf '"'\\''%s\\n'\\'' '\\''ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop'\\'' >> \""'$f"
'"'"
  echo 831a57f9cadf3e0a395efd459a7a83ef >> "$state"
fi
# step 7: run sh -ec 'command -v apt-get >/dev/null || { echo '\''apt-get not found: these packages are for the apt family'\'' >&2; exit 1; }
if ! grep -qx 7d3642dbd2608d527ef792702bfdab17 "$state"; then
  sh -c "sh -ec 'command -v apt-get >/dev/null || { echo '\\''apt-get not found: these packages are for the apt family'\\'' >&2; exit 1; }
if "'! { dpkg-query -W -f='"'\\''"'${db:Status-Abbrev}${Version}'"\\n'\\'' nginx 2>/dev/null | grep -q '\\''"'^ii'"'\\'' && dpkg-query -W -f='\\''"'${db:Status-Abbrev}${Version}'"\\n'\\'' containerd 2>/dev/null | grep -q '\\''"'^ii'"'\\''; }; then
  export DEBIAN_FRONTEND=noninteractive
  w=; if command -v eatmydata >/dev/null; then w=eatmydata; fi
  "'$w apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet update
  $w apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet install nginx containerd
fi
'"'"
  echo 7d3642dbd2608d527ef792702bfdab17 >> "$state"
fi
# step 8: write /etc/app/it's.conf
if ! grep -qx 4024e20c085e61784acb2b24b84c41be "$state"; then
  mkdir -p "$(dirname "/etc/app/it's.conf")"
  printf '%s' 'YSAncXVvdGVkJyBsaW5lCglhbmQgYSB0YWIKeCA9ICd5JyAjIHoK' | base64 -d > "/etc/app/it's.conf.machine-core-tmp"
  chmod 644 "/etc/app/it's.conf.machine-core-tmp"
  mv -f "/etc/app/it's.conf.machine-core-tmp" "/etc/app/it's.conf"
  echo 4024e20c085e61784acb2b24b84c41be >> "$state"
fi
# step 9: write /etc/app/bin
if ! grep -qx c9f79de2e7cf461f9b4f360ab0933a22 "$state"; then
  mkdir -p "$(dirname /etc/app/bin)"
  printf '%s' 'AJ+Slv8=' | base64 -d > /etc/app/bin.machine-core-tmp
  chmod 644 /etc/app/bin.machine-core-tmp
  mv -f /etc/app/bin.machine-core-tmp /etc/app/bin
  echo c9f79de2e7cf461f9b4f360ab0933a22 >> "$state"
fi
# step 10: write /etc/systemd/system/app.service
if ! grep -qx 8620ec86dd47bea07b02d070ad0daf4b "$state"; then
  mkdir -p "$(dirname /etc/systemd/system/app.service)"
  printf '%s' 'W1VuaXRdCkRlc2NyaXB0aW9uPWFwcApbU2VydmljZV0KRXhlY1N0YXJ0PS91c3IvYmluL3NsZWVwIGluZmluaXR5CltJbnN0YWxsXQpXYW50ZWRCeT1tdWx0aS11c2VyLnRhcmdldAo=' | base64 -d > /etc/systemd/system/app.service.machine-core-tmp
  chmod 644 /etc/systemd/system/app.service.machine-core-tmp
  mv -f /etc/systemd/system/app.service.machine-core-tmp /etc/systemd/system/app.service
  echo 8620ec86dd47bea07b02d070ad0daf4b >> "$state"
fi
# step 11: write /etc/sysctl.d/90-k8s.conf
if ! grep -qx 259e2d3bcbf7ff18e8d73dbe8db8e357 "$state"; then
  mkdir -p "$(dirname /etc/sysctl.d/90-k8s.conf)"
  printf '%s' 'bmV0LmlwdjQuaXBfZm9yd2FyZCA9IDEKdm0uc3dhcHBpbmVzcyA9IDAK' | base64 -d > /etc/sysctl.d/90-k8s.conf.machine-core-tmp
  chmod 644 /etc/sysctl.d/90-k8s.conf.machine-core-tmp
  mv -f /etc/sysctl.d/90-k8s.conf.machine-core-tmp /etc/sysctl.d/90-k8s.conf
  echo 259e2d3bcbf7ff18e8d73dbe8db8e357 >> "$state"
fi
# step 12: write /etc/modules-load.d/k8s.conf
if ! grep -qx b7f7d8e28122174e26a7f4c7010cf158 "$state"; then
  mkdir -p "$(dirname /etc/modules-load.d/k8s.conf)"
  printf '%s' 'b3ZlcmxheQo=' | base64 -d > /etc/modules-load.d/k8s.conf.machine-core-tmp
  chmod 644 /etc/modules-load.d/k8s.conf.machine-core-tmp
  mv -f /etc/modules-load.d/k8s.conf.machine-core-tmp /etc/modules-load.d/k8s.conf
  echo b7f7d8e28122174e26a7f4c7010cf158 >> "$state"
fi
# step 13: write /etc/modules-load.d/containerd.conf
if ! grep -qx a60a7e68a80d5de2155f84c2e941deee "$state"; then
  mkdir -p "$(dirname /etc/modules-load.d/containerd.conf)"
  printf '%s' 'b3ZlcmxheQpicl9uZXRmaWx0ZXIK' | base64 -d > /etc/modules-load.d/containerd.conf.machine-core-tmp
  chmod 644 /etc/modules-load.d/containerd.conf.machine-core-tmp
  mv -f /etc/modules-load.d/containerd.conf.machine-core-tmp /etc/modules-load.d/containerd.conf
  echo a60a7e68a80d5de2155f84c2e941deee >> "$state"
fi
# step 14: write /etc/sysctl.d/99-kubernetes-cri.conf
if ! grep -qx d6f5e23f058078925ea5c5328463c39d "$state"; then
  mkdir -p "$(dirname /etc/sysctl.d/99-kubernetes-cri.conf)"
  printf '%s' 'bmV0LmJyaWRnZS5icmlkZ2UtbmYtY2FsbC1pcHRhYmxlcyA9IDEKbmV0LmJyaWRnZS5icmlkZ2UtbmYtY2FsbC1pcDZ0YWJsZXMgPSAxCm5ldC5pcHY0LmlwX2ZvcndhcmQgPSAxCg==' | base64 -d > /etc/sysctl.d/99-kubernetes-cri.conf.machine-core-tmp
  chmod 644 /etc/sysctl.d/99-kubernetes-cri.conf.machine-core-tmp
  mv -f /etc/sysctl.d/99-kubernetes-cri.conf.machine-core-tmp /etc/sysctl.d/99-kubernetes-cri.conf
  echo d6f5e23f058078925ea5c5328463c39d >> "$state"
fi
# step 15: write /etc/containerd/config.toml
if ! grep -qx 16a7c8b233eeccfbb339575cdbd1b06e "$state"; then
  mkdir -p "$(dirname /etc/containerd/config.toml)"
  printf '%s' 'IyBXcml0dGVuIGJ5IHRoZSBjb250YWluZXJkIHJlY2lwZTogdGhlIGt1YmVsZXQncyBzeXN0ZW1kIGNncm91cCBkcml2ZXIgbmVlZHMKIyBjb250YWluZXJkJ3MgcnVuYyBydW50aW1lIHRvIHVzZSBzeXN0ZW1kIGNncm91cHMgdG9vLgp2ZXJzaW9uID0gMgoKW3BsdWdpbnMuImlvLmNvbnRhaW5lcmQuZ3JwYy52MS5jcmkiXQogIHNhbmRib3hfaW1hZ2UgPSAicmVnaXN0cnkuazhzLmlvL3BhdXNlOjMuOSIKCltwbHVnaW5zLiJpby5jb250YWluZXJkLmdycGMudjEuY3JpIi5jb250YWluZXJkLnJ1bnRpbWVzLnJ1bmNdCiAgcnVudGltZV90eXBlID0gImlvLmNvbnRhaW5lcmQucnVuYy52MiIKCltwbHVnaW5zLiJpby5jb250YWluZXJkLmdycGMudjEuY3JpIi5jb250YWluZXJkLnJ1bnRpbWVzLnJ1bmMub3B0aW9uc10KICBTeXN0ZW1kQ2dyb3VwID0gdHJ1ZQo=' | base64 -d > /etc/containerd/config.toml.machine-core-tmp
  chmod 644 /etc/containerd/config.toml.machine-core-tmp
  mv -f /etc/containerd/config.toml.machine-core-tmp /etc/containerd/config.toml
  echo 16a7c8b233eeccfbb339575cdbd1b06e >> "$state"
fi
# step 16: run sh -ec 'if [ "$(stat -c %a /etc/sudoers.d/90-recipes-app 2>/dev/null)" = 440 ] && printf '\''%s\n'\'' '\''app ALL=(root) NOPASSWD: /usr/bin/systemctl restart app'\'' | cmp -s - /etc/sudoers.d/90-recipes-app; then exit 0; fi
if ! grep -qx 4203085605b8f5f4c73151421b2e0bf7 "$state"; then
  sh -c "sh -ec 'if [ \""'$(stat -c %a /etc/sudoers.d/90-recipes-app 2>/dev/null)" = 440 ] && printf '"'\\''%s\\n'\\'' '\\''app ALL=(root) NOPASSWD: /usr/bin/systemctl restart app'\\'' | cmp -s - /etc/sudoers.d/90-recipes-app; then exit 0; fi
command -v visudo >/dev/null || { printf '\\''%s: visudo not found: the sudo rule cannot be checked (install sudo first)\\n'\\'' '\\''layer base.recipes[2].sudo'\\'' >&2; exit 1; }
mkdir -p /etc/sudoers.d
printf '\\''%s\\n'\\'' '\\''app ALL=(root) NOPASSWD: /usr/bin/systemctl restart app'\\'' > /etc/sudoers.d/90-recipes-app.recipes-new
chmod 0440 /etc/sudoers.d/90-recipes-app.recipes-new
if "'! out=$(visudo -cf /etc/sudoers.d/90-recipes-app.recipes-new 2>&1); then
  rm -f /etc/sudoers.d/90-recipes-app.recipes-new
  printf '"'\\''%s: visudo refuses the sudo rule (%s left as it was): %s\\n'\\'' '\\''layer base.recipes[2].sudo'\\'' /etc/sudoers.d/90-recipes-app \""'$out" >&2
  exit 1
fi
mv -f /etc/sudoers.d/90-recipes-app.recipes-new /etc/sudoers.d/90-recipes-app
'"'"
  echo 4203085605b8f5f4c73151421b2e0bf7 >> "$state"
fi
# step 17: run sh -ec 'if [ "$(stat -c %a /etc/sudoers.d/90-recipes-ops 2>/dev/null)" = 440 ] && printf '\''%s\n'\'' '\''ops ALL=(ALL) NOPASSWD:ALL'\'' | cmp -s - /etc/sudoers.d/90-recipes-ops; then exit 0; fi
if ! grep -qx 6404f4ceb40b31e73d364c5ee9518560 "$state"; then
  sh -c "sh -ec 'if [ \""'$(stat -c %a /etc/sudoers.d/90-recipes-ops 2>/dev/null)" = 440 ] && printf '"'\\''%s\\n'\\'' '\\''ops ALL=(ALL) NOPASSWD:ALL'\\'' | cmp -s - /etc/sudoers.d/90-recipes-ops; then exit 0; fi
command -v visudo >/dev/null || { printf '\\''%s: visudo not found: the sudo rule cannot be checked (install sudo first)\\n'\\'' '\\''layer base.recipes[3].sudo'\\'' >&2; exit 1; }
mkdir -p /etc/sudoers.d
printf '\\''%s\\n'\\'' '\\''ops ALL=(ALL) NOPASSWD:ALL'\\'' > /etc/sudoers.d/90-recipes-ops.recipes-new
chmod 0440 /etc/sudoers.d/90-recipes-ops.recipes-new
if "'! out=$(visudo -cf /etc/sudoers.d/90-recipes-ops.recipes-new 2>&1); then
  rm -f /etc/sudoers.d/90-recipes-ops.recipes-new
  printf '"'\\''%s: visudo refuses the sudo rule (%s left as it was): %s\\n'\\'' '\\''layer base.recipes[3].sudo'\\'' /etc/sudoers.d/90-recipes-ops \""'$out" >&2
  exit 1
fi
mv -f /etc/sudoers.d/90-recipes-ops.recipes-new /etc/sudoers.d/90-recipes-ops
'"'"
  echo 6404f4ceb40b31e73d364c5ee9518560 >> "$state"
fi
# step 18: run sh -ec 'mkdir -p /srv/data
if ! grep -qx 3f59e77122f6c28ce813074bb0c3a061 "$state"; then
  sh -c "sh -ec 'mkdir -p /srv/data
find /srv/data -maxdepth 0 -user app -group deploy 2>/dev/null | grep -q . || chown app:deploy /srv/data
[ \""'$(stat -c %a /srv/data)" = 750 ] || chmod 0750 /srv/data
'"'"
  echo 3f59e77122f6c28ce813074bb0c3a061 >> "$state"
fi
# step 19: run sh -ec 'f='\''/etc/app/it'\''\'\'''\''s.conf'\''
if ! grep -qx 945a7ed857fc3971997a56ce66868829 "$state"; then
  sh -c "sh -ec 'f='\\''/etc/app/it'\\''\\'\\'''\\''s.conf'\\''
l='\\''x = '\\''\\'\\'''\\''y'\\''\\'\\'''\\'' # z'\\''
[ -e \""'$f" ] || : > "$f"
if ! grep -qxF -- "$l" "$f"; then
  if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >> "$f"; fi
  printf '"'\\''%s\\n'\\'' \""'$l" >> "$f"
fi
'"'"
  echo 945a7ed857fc3971997a56ce66868829 >> "$state"
fi
# step 20: run sh -ec 'mkdir -p /etc/systemd/system/multi-user.target.wants
if ! grep -qx 7e5bdbb1d7ef9cd4e07edffb9dcf52f3 "$state"; then
  sh -c "sh -ec 'mkdir -p /etc/systemd/system/multi-user.target.wants
[ \""'$(readlink /etc/systemd/system/multi-user.target.wants/app.service)" = /etc/systemd/system/app.service ] || ln -sfn /etc/systemd/system/app.service /etc/systemd/system/multi-user.target.wants/app.service
# files e8e0a205d5ce8b06
if [ -d /run/systemd/system ]; then systemctl daemon-reload; systemctl restart app.service; fi
'"'"
  echo 7e5bdbb1d7ef9cd4e07edffb9dcf52f3 >> "$state"
fi
# step 21: run sh -ec '# content 191f6b4506e0eb3d
if ! grep -qx d3b7abcbd3a0871f49634d40becafdd7 "$state"; then
  sh -c "sh -ec '# content 191f6b4506e0eb3d
sysctl -q -p /etc/sysctl.d/90-k8s.conf
'"
  echo d3b7abcbd3a0871f49634d40becafdd7 >> "$state"
fi
# step 22: run sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
if ! grep -qx 8739c4abf0f036080c2601648ddc10ea "$state"; then
  sh -c "sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
'"
  echo 8739c4abf0f036080c2601648ddc10ea >> "$state"
fi
# step 23: run sh -ec 'if [ -f /etc/fstab ] && grep -qE '\''^[^#[:space:]][^[:space:]]*[[:space:]]+[^[:space:]]+[[:space:]]+swap[[:space:]]'\'' /etc/fstab; then
if ! grep -qx 144b8bbf0af19c2b201edecc7a6dc9f9 "$state"; then
  sh -c "sh -ec 'if [ -f /etc/fstab ] && grep -qE '\\''"'^[''^#[:space:]][''^[:space:]]*[[:space:]]+[''^[:space:]]+[[:space:]]+swap[[:space:]]'"'\\'' /etc/fstab; then
  sed -i -E '\\''s/"'^([''^#[:space:]][''^[:space:]]*[[:space:]]+[''^[:space:]]+[[:space:]]+swap[[:space:]].*)$/#'"\\1/'\\'' /etc/fstab
fi
if [ \""'$(wc -l < /proc/swaps)" -gt 1 ]; then swapoff -a; fi
'"'"
  echo 144b8bbf0af19c2b201edecc7a6dc9f9 >> "$state"
fi
# step 24: run sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
if ! grep -qx 272b2d1cf2801d86a18d05ec29bdcc21 "$state"; then
  sh -c "sh -ec '[ -d /sys/module/overlay ] || modprobe overlay
[ -d /sys/module/br_netfilter ] || modprobe br_netfilter
'"
  echo 272b2d1cf2801d86a18d05ec29bdcc21 >> "$state"
fi
# step 25: run sh -ec '# content b970372924dd8730
if ! grep -qx d184c24698c215c01963cc4a64dcff5c "$state"; then
  sh -c "sh -ec '# content b970372924dd8730
sysctl -q -p /etc/sysctl.d/99-kubernetes-cri.conf
'"
  echo d184c24698c215c01963cc4a64dcff5c >> "$state"
fi
# step 26: run sh -ec '# config 8fb463130e56a44c
if ! grep -qx f62fde08db840ae74aaa2156c0103e99 "$state"; then
  sh -c "sh -ec '# config 8fb463130e56a44c
if [ -d /run/systemd/system ]; then systemctl restart containerd; fi
'"
  echo f62fde08db840ae74aaa2156c0103e99 >> "$state"
fi
