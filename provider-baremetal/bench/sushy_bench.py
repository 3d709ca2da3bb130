"""The sushy side of provider-baremetal's Redfish benchmark (run by
provider-baremetal/examples/bench_redfish.rs).

Each machine goes through what RedfishProvider's create and delete do, with the sushy
client library (OpenStack Ironic's Redfish library): claim the first free server of the
pool (an exclusive file in the claim directory, as the provider's claims are), GET the
system, list its virtual media and take the CD, InsertMedia with the machine's seed ISO
(served by this process from a loopback HTTP server), PATCH a one-time boot override to
Cd, Reset On; then release: poll PowerState until On (sushy-tools applies resets 1-11 s
later, and the provider waits for the pending power-on to land before it forces the
server off), Reset ForceOff, poll until Off, EjectMedia, remove the claim. Polls every
0.25 s, as the provider does. One Sushy connection (basic auth, no session) per thread.
Prints one JSON line: {"wall_s", "cpu_s", "machines"}; cpu_s is this process's user +
system time, the seed server's included.
"""

import argparse
import functools
import http.server
import json
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import sushy
from sushy import auth


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="the BMC, http://127.0.0.1:PORT")
    ap.add_argument("--systems", required=True, help="a file with one system id a line")
    ap.add_argument("--seeds", required=True, help="a directory of bench-NNNN.iso seeds")
    ap.add_argument("--claims", required=True, help="the claim directory")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    with open(args.systems) as f:
        systems = [line.strip() for line in f if line.strip()]

    # The seeds, served as the provider serves its own: from this process, on loopback.
    handler = functools.partial(QuietHandler, directory=args.seeds)
    seeds = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=seeds.serve_forever, daemon=True).start()
    seed_url = f"http://127.0.0.1:{seeds.server_address[1]}"

    local = threading.local()

    def conn() -> sushy.Sushy:
        c = getattr(local, "conn", None)
        if c is None:
            c = local.conn = sushy.Sushy(
                args.endpoint,
                auth=auth.BasicAuth(username="admin", password="bench"),
                server_side_retries=0,
            )
        return c

    def claim(name: str) -> int:
        for i in range(len(systems)):
            try:
                fd = os.open(os.path.join(args.claims, f"s{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({"owner": "bench-sushy", "name": name, "powered": True}, f)
            return i
        raise RuntimeError(f"no free server for {name}")

    def wait_power(c: sushy.Sushy, path: str, want: str) -> None:
        # A fresh System per poll, as Ironic's redfish driver reads one: refreshing the
        # loaded one would re-read its cached virtual media too (3 more GETs a poll).
        deadline = time.monotonic() + 30
        while True:
            if c.get_system(path).power_state == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not reach {want} in 30 s")
            time.sleep(0.25)

    def one(n: int) -> None:
        name = f"bench-{n:04d}"
        i = claim(name)
        c = conn()
        path = f"/redfish/v1/Systems/{systems[i]}"
        system = c.get_system(path)
        cd = next(m for m in system.virtual_media.get_members()
                  if {sushy.VirtualMediaType.CD, sushy.VirtualMediaType.DVD} & set(m.media_types))
        if cd.inserted:
            cd.eject_media()
        cd.insert_media(f"{seed_url}/{name}.iso")
        system.set_system_boot_options(target=sushy.BootSource.CD,
                                       enabled=sushy.BootSourceOverrideEnabled.ONCE)
        system.reset_system(sushy.ResetType.ON)
        # Release.
        wait_power(c, path, sushy.PowerState.ON)
        system.reset_system(sushy.ResetType.FORCE_OFF)
        wait_power(c, path, sushy.PowerState.OFF)
        cd.eject_media()
        os.unlink(os.path.join(args.claims, f"s{i}"))

    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(args.count)))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    seeds.shutdown()
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "machines": args.count}))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the seed directory without a log line per download."""

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


if __name__ == "__main__":
    main()
