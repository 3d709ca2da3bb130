#!/usr/bin/env python3
"""moto's CPU per tag-filtered DescribeInstances, for each order of the filters a name
lookup can send (BENCHMARKS.md, provider-aws at fleet scale).

Starts its own moto server, launches INSTANCES instances tagged as provider-aws tags
them (Name, owner, managed), terminates all but LIVE of them (a fleet that has been
replacing machines), then times DESCRIBES lookups of 12 names in each filter order by
moto's own CPU time (/proc/PID/stat).

    bash scripts/peers/30-moto.sh
    python3 provider-aws/bench/listing_cost.py --instances 500 --live 32
"""

import argparse
import os
import socket
import subprocess
import time

import boto3

OWNER_TAG = "machine-provisioning/owner"
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=500)
    ap.add_argument("--live", type=int, default=32)
    ap.add_argument("--describes", type=int, default=30)
    args = ap.parse_args()

    port = free_port()
    moto = subprocess.Popen(
        ["moto_server", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ec2 = boto3.client(
            "ec2",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        for _ in range(100):
            try:
                ec2.describe_regions()
                break
            except Exception:
                time.sleep(0.1)
        ids = []
        for i in range(args.instances):
            tags = [
                {"Key": "Name", "Value": f"bench-{i:04}"},
                {"Key": OWNER_TAG, "Value": "bench"},
                {"Key": "machine-provisioning/managed", "Value": "true"},
            ]
            run = ec2.run_instances(
                ImageId="ami-760aaa0f",
                InstanceType="t3.micro",
                MinCount=1,
                MaxCount=1,
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )
            ids.append(run["Instances"][0]["InstanceId"])
        gone = ids[: args.instances - args.live]
        for i in range(0, len(gone), 100):
            ec2.terminate_instances(InstanceIds=gone[i : i + 100])

        tick = os.sysconf("SC_CLK_TCK")

        def moto_cpu() -> float:
            with open(f"/proc/{moto.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        # Twelve names of live instances, as a create's batch would ask.
        names = [f"bench-{i:04}" for i in range(args.instances - 12, args.instances)]
        by_name = {"Name": "tag:Name", "Values": names}
        by_owner = {"Name": f"tag:{OWNER_TAG}", "Values": ["bench"]}
        by_state = {"Name": "instance-state-name", "Values": LIVE_STATES}
        orders = [
            ("owner, names", [by_owner, by_name]),
            ("names, owner", [by_name, by_owner]),
            ("state, names, owner (provider-aws)", [by_state, by_name, by_owner]),
        ]
        print(f"{args.instances} instances, {len(gone)} terminated; 12 names a lookup")
        for label, filters in orders:
            before = moto_cpu()
            for _ in range(args.describes):
                ec2.describe_instances(Filters=filters)
            ms = (moto_cpu() - before) / args.describes * 1000
            print(f"{label:40} {ms:7.1f} ms of moto CPU a call")
        before = moto_cpu()
        for iid in ids[: args.describes]:
            ec2.describe_instances(InstanceIds=[iid])
        ms = (moto_cpu() - before) / args.describes * 1000
        print(f"{'by instance id':40} {ms:7.1f} ms of moto CPU a call")
    finally:
        moto.kill()
        moto.wait()


if __name__ == "__main__":
    main()
