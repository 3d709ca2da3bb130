"""boto3 side of provider-aws's benchmark (run by provider-aws/examples/bench_aws.rs).

Makes the same EC2 calls provider-aws makes for each machine, with 32 threads:
DescribeInstances by tags (the adoption lookup), RunInstances with the same tags and a
ClientToken, DescribeInstances by id until running, then DescribeInstances by id (the
ownership check before a delete) and TerminateInstances. Retries are off, as in
provider-aws's default, so every call is one request. Prints one JSON line:
{"wall_s", "cpu_s", "calls", "machines"}; cpu_s is this process's user + system time.
"""

import argparse
import hashlib
import json
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config

LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--owner", default="bench-boto3")
    ap.add_argument("--image", default="ami-760aaa0f")
    args = ap.parse_args()

    client = boto3.client(
        "ec2",
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(
            max_pool_connections=args.concurrency,
            retries={"mode": "standard", "max_attempts": 1},
        ),
    )
    calls = 0
    lock = threading.Lock()

    def call(fn, **kw):
        nonlocal calls
        with lock:
            calls += 1
        return fn(**kw)

    def one(i: int) -> None:
        name = f"bench-{i:04d}"
        tags = [
            {"Key": "Name", "Value": name},
            {"Key": "machine-provisioning/managed", "Value": "true"},
            {"Key": "machine-provisioning/owner", "Value": args.owner},
        ]
        found = call(
            client.describe_instances,
            Filters=[
                {"Name": "tag:Name", "Values": [name]},
                {"Name": "tag:machine-provisioning/owner", "Values": [args.owner]},
                {"Name": "tag:machine-provisioning/managed", "Values": ["true"]},
                {"Name": "instance-state-name", "Values": LIVE},
            ],
        )
        assert not any(r["Instances"] for r in found["Reservations"]), name
        token = hashlib.sha256(f"{args.owner}\0{name}".encode()).hexdigest()[:32] + "-g0"
        run = call(
            client.run_instances,
            ImageId=args.image,
            InstanceType="t3.micro",
            MinCount=1,
            MaxCount=1,
            ClientToken=token,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        )
        iid = run["Instances"][0]["InstanceId"]
        while True:
            d = call(client.describe_instances, InstanceIds=[iid])
            if d["Reservations"][0]["Instances"][0]["State"]["Name"] == "running":
                break
            time.sleep(0.2)
        call(client.describe_instances, InstanceIds=[iid])
        call(client.terminate_instances, InstanceIds=[iid])

    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(args.count)))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "calls": calls, "machines": args.count}))


if __name__ == "__main__":
    main()
