"""pyvmomi side of provider-vsphere's benchmark (run by
provider-vsphere/examples/bench_vsphere.rs), and the stand-in for VMware Tools.

Bench mode: each of --count VMs is cloned from the template into --folder with the same
extraConfig the provider writes (owner and name tags, 2 KiB of user data as gzip+base64
guestinfo), 1 CPU and 64 MiB in the clone spec, powered on, polled every --poll seconds
until it has a guest IP, powered off and destroyed, by --concurrency threads on one
session, each task waited with pyVim.task.WaitForTask (what a pyvmomi user, and
Ansible's community.vmware, does). The connection pool is sized to the threads
(pyvmomi's default of 5 would make the other threads open a fresh TLS connection per
call). Every SOAP call is counted. Prints one JSON line: {"wall_s", "cpu_s", "calls",
"machines", "retries"}; cpu_s is this process's user + system time; retries counts calls
repeated after vcsim dropped the connection. A VM without an address 120 s after its
power-on fails the run, and so does a run longer than --deadline seconds.

--tools: plays VMware Tools for every VM powered on after it started: a guest boots and
reports an address, which it gives through extraConfig `SET.guest.ipAddress` (vcsim's
hook). It learns of power-ons from the TaskManager's recent tasks (reading only new
ones, so its cost does not grow with the inventory), over bare SOAP (see RawSoap), and
runs until killed, in its own session, so neither side pays for it. It prints "ready"
once it has read the tasks that are not the bench's, and the bench starts only then.
"""

import argparse
import base64
import gzip
import http.client
import json
import os
import re
import resource
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pyVim.connect import SmartConnect
from pyVim.task import WaitForTask
from pyVmomi import SoapAdapter, vim, vmodl

CALLS = 0
RETRIES = 0
# How long a VM may wait for its guest address after power-on (the stand-in gives one
# within a poll or two).
ADDRESS_LIMIT = 120
CALLS_LOCK = threading.Lock()


def counted(f):
    def wrapper(*a, **k):
        global CALLS
        with CALLS_LOCK:
            CALLS += 1
        return f(*a, **k)

    return wrapper


# Every SOAP request pyvmomi sends goes through this one (a property read too: its
# InvokeAccessor calls InvokeMethod with a Fetch).
SoapAdapter.SoapStubAdapter.InvokeMethod = counted(SoapAdapter.SoapStubAdapter.InvokeMethod)


def again(op, gone_is_done=False, state_is_done=False):
    """Calls op until it does not lose its connection, at most four times. vcsim 0.24
    panics in a request now and then under concurrency (in Destroy_Task when a
    concurrent clone has blanked the disk backing it shares with the template; the VM
    is unregistered by then) and drops the connection: counted in RETRIES and repeated,
    as the provider's side does. A repeated destroy that finds nothing is done, and so is
    a repeated power task that finds the VM in the state it asked for."""
    global RETRIES
    for tries in range(4):
        try:
            return op()
        except (http.client.RemoteDisconnected, ConnectionError):
            if tries == 3:
                raise
            with CALLS_LOCK:
                RETRIES += 1
        except vmodl.fault.ManagedObjectNotFound:
            if gone_is_done and tries > 0:
                return None
            raise
        except vim.fault.InvalidPowerState:
            # A power task repeated after a dropped connection had taken effect.
            if state_is_done and tries > 0:
                return None
            raise


def connect(args, user):
    host, port = args.host.rsplit(":", 1)
    si = SmartConnect(host=host, port=int(port), user=user, pwd="pass",
                      thumbprint=args.thumbprint)
    si._stub.poolSize = args.concurrency
    return si


class RawSoap:
    """A bare SOAP session for the Tools stand-in: pyvmomi's deserializer costs tens of
    milliseconds for a list of 200 tasks, which would make the stand-in's latency depend
    on how busy the machine is; answers are searched as text instead."""

    def __init__(self, args, user):
        host, port = args.host.rsplit(":", 1)
        # A bound on every answer: a request vcsim never answers made the stand-in (and so
        # every VM waiting for its address) wait for ever.
        self.conn = http.client.HTTPSConnection(host, int(port), timeout=60, context=ssl._create_unverified_context())
        self.cookie = None
        self.call("Login", '<_this type="SessionManager">SessionManager</_this>'
                  f"<userName>{user}</userName><password>pass</password>")

    def call(self, method, body):
        envelope = ('<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
                    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema">'
                    f'<soapenv:Body><{method} xmlns="urn:vim25">{body}</{method}></soapenv:Body></soapenv:Envelope>')
        headers = {"Content-Type": "text/xml", "SOAPAction": '"urn:vim25/6.5"'}
        if self.cookie:
            headers["Cookie"] = self.cookie
        self.conn.request("POST", "/sdk", envelope, headers)
        answer = self.conn.getresponse()
        cookie = answer.getheader("set-cookie")
        if cookie:
            self.cookie = cookie.split(";")[0]
        return answer.read().decode()


def tools(args) -> None:
    soap = RawSoap(args, "tools")
    recent = ('<_this type="PropertyCollector">propertyCollector</_this><specSet><propSet><type>TaskManager</type>'
              '<pathSet>recentTask</pathSet></propSet><objectSet><obj type="TaskManager">TaskManager</obj></objectSet>'
              '</specSet><options/>')

    def tasks():
        return re.findall(r'type="Task">([^<]+)<', soap.call("RetrievePropertiesEx", recent))

    found = soap.call("FindByInventoryPath", '<_this type="SearchIndex">SearchIndex</_this>'
                      f"<inventoryPath>{args.folder}</inventoryPath>")
    folder = re.search(r'type="Folder">([^<]+)<', found).group(1)
    # The folder's VMs, read only when recentTask may have dropped a power-on unseen.
    in_folder = ('<_this type="PropertyCollector">propertyCollector</_this><specSet><propSet><type>VirtualMachine</type>'
                 '<pathSet>runtime.powerState</pathSet><pathSet>guest.ipAddress</pathSet></propSet>'
                 f'<objectSet><obj type="Folder">{folder}</obj><skip>true</skip><selectSet xsi:type="TraversalSpec">'
                 '<type>Folder</type><path>childEntity</path><skip>false</skip></selectSet></objectSet></specSet><options/>')

    seen = set(tasks())  # power-ons before the bench: not ours
    waiting = []
    given = 0
    gaps = 0

    def give(vm):
        nonlocal given
        given += 1
        ip = f"10.{given // 65536 % 256}.{given // 256 % 256}.{given % 256}"
        # Destroyed or powered off meanwhile: a fault, nothing to report.
        soap.call("ReconfigVM_Task", (
            f'<_this type="VirtualMachine">{vm}</_this><spec><extraConfig xsi:type="OptionValue">'
            f'<key>SET.guest.ipAddress</key><value xsi:type="xsd:string">{ip}</value></extraConfig></spec>'))

    def sweep():
        """Gives an address to every VM of the folder powered on without one."""
        for o in soap.call("RetrievePropertiesEx", in_folder).split("<objects>")[1:]:
            vm = re.search(r'type="VirtualMachine">([^<]+)<', o)
            has_ip = re.search(r"<name>guest\.ipAddress</name><val[^>]*>[^<]+<", o)
            if vm and ">poweredOn<" in o and not has_ip:
                give(vm.group(1))

    # Power-ons before the snapshot above are taken as not ours: a bench that started
    # before it (the stand-in started late on a loaded machine) would have its first VMs
    # wait for ever. The folder's VMs are read once after the snapshot, and the bench
    # waits for the line below before it starts.
    sweep()
    print("ready", flush=True)

    while True:
        try:
            listed = tasks()
            # vcsim keeps the last 200 tasks: when the oldest listed is new to us, tasks
            # went by unseen (the stand-in was starved on a loaded machine), and a VM
            # powered on then would wait for its address for ever. The folder's VMs
            # powered on without one get it instead.
            if len(listed) >= 200 and listed[0] not in seen:
                gaps += 1
                print(f"tools: tasks went by unseen ({gaps}); reading {args.folder}", file=sys.stderr)
                sweep()
            fresh = [t for t in listed if t not in seen]
            seen.update(fresh)
            ask = waiting + fresh
            waiting = []
            if ask:
                objects = "".join(f'<objectSet><obj type="Task">{t}</obj></objectSet>' for t in ask)
                text = soap.call("RetrievePropertiesEx", (
                    '<_this type="PropertyCollector">propertyCollector</_this><specSet><propSet><type>Task</type>'
                    '<pathSet>info.descriptionId</pathSet><pathSet>info.state</pathSet><pathSet>info.entity</pathSet>'
                    f'</propSet>{objects}</specSet><options/>'))
                for o in text.split("<objects>")[1:]:
                    if ">VirtualMachine.powerOn<" not in o:
                        continue
                    task = re.search(r'type="Task">([^<]+)<', o).group(1)
                    if ">queued<" in o or ">running<" in o:
                        waiting.append(task)
                        continue
                    vm = re.search(r'type="VirtualMachine">([^<]+)<', o)
                    if ">success<" not in o or not vm:
                        continue
                    give(vm.group(1))
        except (http.client.HTTPException, ConnectionError, TimeoutError):
            soap = RawSoap(args, "tools")  # vcsim dropped the connection (see again())
        time.sleep(args.poll / 4)


def bench(args) -> None:
    si = connect(args, "bench-pyvmomi")
    content = si.RetrieveContent()
    find = content.searchIndex.FindByInventoryPath
    template = find(args.template)
    folder = find(args.folder)
    pool = find(args.pool)
    raw = b"#cloud-config\n" + b"# padding\n" * 203
    user_data = base64.b64encode(gzip.compress(raw)).decode()

    def opt(k, v):
        return vim.option.OptionValue(key=k, value=v)

    def one(i: int) -> None:
        name = f"bench-{i:04d}"
        config = vim.vm.ConfigSpec(numCPUs=1, memoryMB=64, extraConfig=[
            opt("machineprovisioning.owner", args.owner),
            opt("machineprovisioning.name", name),
            opt("guestinfo.userdata", user_data),
            opt("guestinfo.userdata.encoding", "gzip+base64"),
        ])
        clone = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(pool=pool), config=config,
                                 powerOn=False, template=False)
        task = template.CloneVM_Task(folder=folder, name=name, spec=clone)
        WaitForTask(task, si=si)
        vm = task.info.result
        again(lambda: WaitForTask(vm.PowerOnVM_Task(), si=si), state_is_done=True)
        since = time.monotonic()
        while not again(lambda: vm.guest.ipAddress):
            if time.monotonic() - since > ADDRESS_LIMIT:
                raise RuntimeError(f"{name} ({vm._moId}): no guest address {ADDRESS_LIMIT} s after "
                                   "its power-on; the VMware Tools stand-in gave none")
            time.sleep(args.poll)
        again(lambda: WaitForTask(vm.PowerOffVM_Task(), si=si), state_is_done=True)
        again(lambda: WaitForTask(vm.Destroy_Task(), si=si), gone_is_done=True)

    # A bound on the whole run: a VM that never gets an address, or a call that never
    # returns, ends it with a message instead of a bench waiting until killed.
    def expired():
        print(f"pyvmomi_bench.py: {args.count} VMs not done in {args.deadline} s", file=sys.stderr)
        os._exit(3)

    watchdog = threading.Timer(args.deadline, expired)
    watchdog.daemon = True
    watchdog.start()
    global CALLS
    CALLS = 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool_:
        list(pool_.map(one, range(args.count)))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "calls": CALLS, "machines": args.count,
                      "retries": RETRIES}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True, help="host:port of vcsim")
    ap.add_argument("--thumbprint", required=True, help="SHA-256 of vcsim's certificate, hex")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--poll", type=float, default=0.1)
    ap.add_argument("--owner", default="bench-pyvmomi")
    ap.add_argument("--template", default="DC0/vm/DC0_H0_VM1")
    ap.add_argument("--folder", default="DC0/vm")
    ap.add_argument("--pool", default="DC0/host/DC0_H0/Resources")
    ap.add_argument("--deadline", type=float, default=900.0,
                    help="seconds the whole run may take before it fails")
    ap.add_argument("--tools", action="store_true")
    args = ap.parse_args()
    if args.tools:
        tools(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
