#!/usr/bin/env bash
# vcsim (govmomi's vCenter simulator) for provider-vsphere's tests, built offline from
# Debian's golang-github-vmware-govmomi-dev (a library package: no vcsim binary) into
# /opt/vcsim3/vcsim (not /opt/vcsim2 nor /opt/vcsim, where scripts of older checkouts
# still build theirs, without some of the changes below). Idempotent: a binary built
# from the same sources is left alone.
# With WITH_BENCH_PEERS=1 it also installs pyvmomi (PyPI) into a venv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/pyvmomi, for the bench_vsphere example.
#
# The binary listens on 127.0.0.1:0 (or -listen), prints one line
# "<url> <sha256 of its TLS certificate, hex>" (the fingerprint is "-" with -tls=false)
# and serves until killed. Before printing, it turns the VM named by -template
# (default DC0_H0_VM1) into a powered-off template, so tests have something to clone.
#
# Changes to Debian's vcsim 0.24.2, made at build time (a -overlay, nothing under
# /usr/share/gocode is touched), each what vCenter does and upstream vcsim does since:
# - ReconfigVM_Task's extraConfig replaces a key set again and removes a key set to "",
#   as upstream since 0.31 ("vcsim: Fix VM ExtraConfig"); 0.24.2 appends every entry,
#   so a key set again is listed twice and no key can be removed. `-extraconfig-appends`
#   keeps 0.24.2's behaviour, for the tests of a server that keeps a removed value.
# - CloneVM_Task takes the clone spec's config.uuid (the BIOS UUID), numCPUs and
#   memoryMB, as upstream since 0.37 (4348bd9f); 0.24.2 drops them: it copies the
#   template's hardware, and derives the UUID from the VM's file path, so a VM made
#   again under a deleted one's name gets the deleted one's UUID.
# - A change of extraConfig is published to property collectors (a filter on
#   config.extraConfig reports it), as upstream since 0.38 (3b7ff25f); 0.24.2 changes
#   the array in place and tells no collector.
# Five more, in the property collector and views, each upstream's own fix:
# - A ContainerView adds an object that enters its subtree under the view's lock, as
#   upstream since 0.44 (5a9567f6, "vcsim: lock ViewManager in RegisterObject
#   callbacks"). 0.24.2 appends to the view's list unlocked, so two VMs made at once
#   (two clones) can both read the old list and one of them is lost from the view for
#   good: a filter over the view never reports it (seen once by provider-vsphere's
#   tests: a VM cloned by a racing create was missing from the view).
# - WaitForUpdatesEx registers its collector for updates before it collects the
#   current state, as upstream since 0.25 (7403b470, "Fix race in simulator's
#   PropertyCollector"); 0.24.2 collects first, so a change between the two is lost.
# - A filter whose spec reads more than one type (provider-vsphere's one filter for its
#   VMs and its tasks) skips a change of an object deleted since, as upstream since 0.47
#   (5e9a140d, "vcsim: avoid possible panic when applying PropertyFilter"); 0.24.2 looks
#   the deleted object up and panics (the connection drops).
# - WaitForUpdatesEx looks for updates every 20 ms, as upstream since 0.25 (4b59b652);
#   0.24.2 every 250 ms, so every answer that waits takes at least a quarter second,
#   where vCenter answers as soon as something changed.
# - A filter destroyed while a WaitForUpdates collects (pyvmomi's WaitForTask on 16
#   threads sharing one collector) is skipped, as upstream since 0.44 (6267644d); 0.24.2
#   panics on it (the connection drops).
# One of ours, not upstream's, in the cost and not in the answers:
# - WaitForUpdatesEx collects the objects that entered its filters once per batch of
#   changes it reports. 0.24.2 (and upstream to this day) collects every object of every
#   filter again for every change anywhere in the inventory, once per filter: a
#   collector watching 30 VMs pays ~30 object reads for each of the ~40 changes a VM's
#   clone, power-on and destroy make, whether they concern its filters or not (60 % of
#   vcsim's CPU in provider-vsphere's benchmark, issue 28). vCenter matches a change
#   against the filters it may concern and reads nothing else. The answers are the
#   same: the first of those collects found every new object, the others found none
#   (an object that enters meanwhile is found by the next batch, its enter being in it).
# - WaitForUpdatesEx with maxWaitSeconds 0 does its one update calculation at once, as
#   the vSphere API documents it ("similar to CheckForUpdates") and vCenter does.
#   0.24.2 (and upstream to this day) does it at the first tick of its update loop, so
#   every such call takes 20 ms: provider-vsphere's barriers (a read that must see every
#   change made before it) use it, and paid that tick each (issue 28). No other
#   answer changes; pyvmomi never sends 0.
# And main.go's -vm N makes N VMs per resource pool (two pools: 2N VMs), as upstream
# vcsim's flag, for benchmarks with a large inventory; it removes its datastore
# directories when stopped with SIGTERM or SIGINT.
set -euo pipefail

dest=/opt/vcsim3

# pyvmomi for the benchmark's other side, only when asked (the tests do not need it).
bench_peers() {
  [ "${WITH_BENCH_PEERS:-0}" = 1 ] || return 0
  local venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/pyvmomi"
  local version=9.1.1.0 # the version BENCHMARKS.md's figures were measured with
  if [ "$("$venv/bin/pip" show pyvmomi 2>/dev/null | sed -n 's/^Version: //p')" != "$version" ]; then
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
      apt-get update
      DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv
    fi
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "pyvmomi==$version"
  fi
  echo "pyvmomi in $venv: $("$venv/bin/pip" show pyvmomi 2>/dev/null | sed -n 's/^Version: //p')"
}
main_go=$(cat <<'GO'
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/simulator"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	useTLS := flag.Bool("tls", true, "serve https with a self-signed certificate")
	template := flag.String("template", "DC0_H0_VM1", "VM to power off and mark as a template ('' for none)")
	appends := flag.Bool("extraconfig-appends", false, "extraConfig entries are appended, never replaced or removed (vcsim 0.24.2 as Debian ships it)")
	vms := flag.Int("vm", 2, "virtual machines per resource pool (the model has two pools)")
	flag.Parse()
	simulator.ExtraConfigAppends = *appends

	model := simulator.VPX()
	model.Machine = *vms
	if err := model.Create(); err != nil {
		fail(err)
	}
	model.Service.RegisterEndpoints = true
	model.Service.Listen = &url.URL{Host: *listen}
	if *useTLS {
		cert, err := selfSigned()
		if err != nil {
			fail(err)
		}
		model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	server := model.Service.NewServer()

	fingerprint := "-"
	if *useTLS {
		sum := sha256.Sum256(server.Certificate().Raw)
		fingerprint = hex.EncodeToString(sum[:])
	}
	if *template != "" {
		if err := markTemplate(server.URL, *template); err != nil {
			fail(err)
		}
	}
	u := *server.URL
	u.User = nil
	fmt.Printf("%s %s\n", u.String(), fingerprint)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	// The datastore directories under $TMPDIR go; the server is not closed first, since
	// Close waits for the requests in flight (a long WaitForUpdatesEx).
	model.Remove()
}

// markTemplate powers the VM off and marks it as a template, as an administrator would.
func markTemplate(u *url.URL, name string) error {
	ctx := context.Background()
	c, err := govmomi.NewClient(ctx, u, true)
	if err != nil {
		return err
	}
	defer c.Logout(ctx)
	finder := find.NewFinder(c.Client, true)
	dc, err := finder.DefaultDatacenter(ctx)
	if err != nil {
		return err
	}
	finder.SetDatacenter(dc)
	vm, err := finder.VirtualMachine(ctx, name)
	if err != nil {
		return err
	}
	task, err := vm.PowerOff(ctx)
	if err != nil {
		return err
	}
	if err := task.Wait(ctx); err != nil {
		return err
	}
	return vm.MarkAsTemplate(ctx)
}

// selfSigned makes a fresh P-256 certificate for 127.0.0.1 and localhost: httptest's
// built-in one has a 1024-bit RSA key, which rustls (rightly) refuses to verify.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	template := x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "vcsim"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, &template, &template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "vcsim:", err)
	os.Exit(1)
}
GO
)

# The extraConfig change, a file added to the simulator package; virtual_machine.go's one
# append of an extraConfig entry is pointed at it (see the top of this script).
extra_config_go=$(cat <<'GO'
package simulator

import "github.com/vmware/govmomi/vim25/types"

// ExtraConfigAppends keeps vcsim 0.24.2's extraConfig: every entry appended.
var ExtraConfigAppends bool

// setExtraConfig applies one extraConfig entry as vCenter does: a key set again takes the
// new value in place, a key set to "" is removed, a new key is added at the end.
func setExtraConfig(opts []types.BaseOptionValue, entry types.BaseOptionValue) []types.BaseOptionValue {
	if ExtraConfigAppends {
		return append(opts, entry)
	}
	set := entry.GetOptionValue()
	empty := false
	if s, ok := set.Value.(string); ok && s == "" {
		empty = true
	}
	out := make([]types.BaseOptionValue, 0, len(opts)+1)
	found := false
	for _, o := range opts {
		if o == nil || o.GetOptionValue() == nil || o.GetOptionValue().Key != set.Key {
			out = append(out, o)
			continue
		}
		found = true
		if !empty {
			out = append(out, entry)
		}
	}
	if !found {
		out = append(out, entry)
	}
	return out
}
GO
)
stamp="$main_go
$extra_config_go
clone uuid and hardware, published extraConfig, view lock, collector order, 20 ms updates, deleted objects in filters, destroyed filters, new objects once per batch, maxWaitSeconds 0 at once"

if [ -x "$dest/vcsim" ] && [ -f "$dest/stamp" ] && [ "$(cat "$dest/stamp")" = "$stamp" ]; then
  echo "vcsim already built at $dest/vcsim"
  bench_peers
  exit 0
fi

if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/vmware/govmomi/simulator ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y golang-go golang-github-vmware-govmomi-dev
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/src/vcsim" "$dest"
printf '%s\n' "$main_go" >"$build/src/vcsim/main.go"
sim=/usr/share/gocode/src/github.com/vmware/govmomi/simulator
printf '%s\n' "$extra_config_go" >"$build/extra_config.go"
sed -e 's/^\(\t*\)vm\.Config\.ExtraConfig = append(vm\.Config\.ExtraConfig, c)$/\1vm.Config.ExtraConfig = setExtraConfig(vm.Config.ExtraConfig, c)\n\1changes = append(changes, types.PropertyChange{Name: "config.extraConfig", Val: vm.Config.ExtraConfig})/' \
  -e 's/^\(\t*\)config\.InstanceUuid = req\.Spec\.Config\.InstanceUuid$/&\n\1config.Uuid = req.Spec.Config.Uuid/' \
  -e 's/^\(\t*\)config\.MemoryMB = int64(vm\.Config\.Hardware\.MemoryMB)$/&\n\1if s := req.Spec.Config; s != nil \&\& s.NumCPUs != 0 {\n\1\tconfig.NumCPUs = s.NumCPUs\n\1}\n\1if s := req.Spec.Config; s != nil \&\& s.MemoryMB != 0 {\n\1\tconfig.MemoryMB = s.MemoryMB\n\1}/' \
  "$sim/virtual_machine.go" >"$build/virtual_machine.go"
if [ "$(grep -c 'setExtraConfig(vm.Config.ExtraConfig, c)' "$build/virtual_machine.go")" != 1 ] ||
  [ "$(grep -c 'Name: "config.extraConfig", Val: vm.Config.ExtraConfig' "$build/virtual_machine.go")" != 1 ] ||
  [ "$(grep -c 'config.NumCPUs = s.NumCPUs' "$build/virtual_machine.go")" != 1 ] ||
  [ "$(grep -c 'config.Uuid = req.Spec.Config.Uuid' "$build/virtual_machine.go")" != 1 ]; then
  echo "50-vcsim.sh: $sim/virtual_machine.go is not the 0.24.2 this script patches" >&2
  exit 1
fi
# The view's lock (upstream 5a9567f6): PutObject's look and append under Map.WithLock(v),
# the lock RemoveObject's Map.RemoveReference already takes.
sed -e 's/^\tif v\.include(ref) && v\.find(v\.root, ref, types\.NewBool(false)) {$/\tMap.WithLock(v, func() {\n&/' \
  -e '/^\t\tMap\.Update(v, \[\]types\.PropertyChange{{Name: "view", Val: append(v\.View, ref)}})$/{n;s/^\t}$/\t}\n\t})/}' \
  "$sim/view_manager.go" >"$build/view_manager.go"
# The collector: registered before the first collect (upstream 7403b470), updates every
# 20 ms (upstream 4b59b652).
# A filter destroyed during a collect is skipped (upstream 6267644d). New objects are
# collected once per batch of changes (ours, see the top of this script).
awk '
  /^\t\tapply\(\)                \/\/ Collect current state$/ { held = $0; next }
  held != "" && /^\t\tset\.Version = "-"/ { print; next }
  held != "" && /^\t\tctx\.Map\.AddHandler\(pc\)/ { print; print held; held = ""; next }
  /^func \(pc \*PropertyCollector\) apply\(/ { in_apply = 1 }
  in_apply && /^\t\tfilter := ctx\.Session\.Get\(ref\)\.\(\*PropertyFilter\)$/ {
    print "\t\tfilter, ok := ctx.Session.Get(ref).(*PropertyFilter)"
    print "\t\tif !ok {"
    print "\t\t\tcontinue"
    print "\t\t}"
    in_apply = 0
    next
  }
  skip > 0 { skip--; next }
  /^\t\t\t\t\t\tif !apply\(\) \{/ { skip = 2; next }
  /^\t\t\tlog\.Printf\("%s: applying %d updates to %d filters"/ {
    print
    print "\t\t\tfor _, update := range updates { // once per batch"
    print "\t\t\t\tif update.Kind != types.ObjectUpdateKindLeave {"
    print "\t\t\t\t\tif !apply() {"
    print "\t\t\t\t\t\treturn body"
    print "\t\t\t\t\t}"
    print "\t\t\t\t\tbreak"
    print "\t\t\t\t}"
    print "\t\t\t}"
    next
  }
  /^\tdefer ticker\.Stop\(\)$/ {
    print
    print "\ttick := ticker.C"
    print "\tif oneUpdate { // one update calculation, at once"
    print "\t\tnow := make(chan time.Time, 1)"
    print "\t\tnow <- time.Now()"
    print "\t\ttick = now"
    print "\t}"
    next
  }
  /^\t\tcase <-ticker\.C:$/ { print "\t\tcase <-tick:"; next }
  { sub(/time\.NewTicker\(250 \* time\.Millisecond\)/, "time.NewTicker(20 * time.Millisecond)"); print }
' "$sim/property_collector.go" >"$build/property_collector.go"
if [ "$(grep -c '^	Map.WithLock(v, func() {$' "$build/view_manager.go")" != 1 ] ||
  [ "$(grep -c '^	})$' "$build/view_manager.go")" -lt 1 ] ||
  [ "$(grep -c 'time.NewTicker(20 \* time.Millisecond)' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -c '^		filter, ok := ctx.Session.Get(ref).(\*PropertyFilter)$' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -c 'for _, update := range updates { // once per batch$' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -c '^	if oneUpdate { // one update calculation, at once$' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -c '^		case <-tick:$' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -c 'if !apply() {' "$build/property_collector.go")" != 1 ] ||
  [ "$(grep -A1 'ctx.Map.AddHandler(pc) // Listen' "$build/property_collector.go" | grep -c 'apply()  ')" != 1 ]; then
  echo "50-vcsim.sh: $sim/view_manager.go or property_collector.go is not the 0.24.2 this script patches" >&2
  exit 1
fi
# A change of an object deleted since (upstream 5e9a140d).
sed -e 's/^\(\t*\)kind = getManagedObject(ctx\.Map\.Get(ref))\.Type()$/\1obj := ctx.Map.Get(ref)\n\1if obj == nil { \/\/ object may have since been deleted\n\1\tcontinue\n\1}\n\1kind = getManagedObject(obj).Type()/' \
  "$sim/property_filter.go" >"$build/property_filter.go"
if [ "$(grep -c 'if obj == nil { // object may have since been deleted' "$build/property_filter.go")" != 1 ]; then
  echo "50-vcsim.sh: $sim/property_filter.go is not the 0.24.2 this script patches" >&2
  exit 1
fi
printf '{"Replace": {"%s": "%s", "%s": "%s", "%s": "%s", "%s": "%s", "%s": "%s"}}\n' \
  "$sim/virtual_machine.go" "$build/virtual_machine.go" \
  "$sim/view_manager.go" "$build/view_manager.go" \
  "$sim/property_collector.go" "$build/property_collector.go" \
  "$sim/property_filter.go" "$build/property_filter.go" \
  "$sim/zz_extra_config.go" "$build/extra_config.go" >"$build/overlay.json"
# Offline: Debian's Go packages sit in a GOPATH tree; no module proxy is asked.
(cd "$build/src/vcsim" &&
  GO111MODULE=off GOPATH="$build:/usr/share/gocode" GOCACHE="$build/cache" \
    go build -overlay "$build/overlay.json" -o "$build/vcsim" .)
install -m 0755 "$build/vcsim" "$dest/vcsim"
printf '%s\n' "$main_go" >"$dest/main.go"
printf '%s\n' "$stamp" >"$dest/stamp"
echo "vcsim built at $dest/vcsim"
bench_peers
