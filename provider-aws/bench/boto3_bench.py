"""boto3 and raw-client sides of provider-aws's benchmark (run by
provider-aws/examples/bench_aws.rs).

Each machine goes through the minimal lifecycle with the minimal four EC2 calls:
RunInstances (tags, a ClientToken, 2 KiB of user data), DescribeInstances by id until
running, TerminateInstances, DescribeInstances by id until terminated. No adoption
lookup, no ownership check: the floor a provider is measured against. `--raw` makes the
same calls as signed HTTP requests (botocore's SigV4 signer, one keep-alive connection
per thread, answers read with a regular expression) instead of through boto3. Retries
are off, so every call is one request. Prints one JSON line:
{"wall_s", "cpu_s", "calls", "machines"}; cpu_s is this process's user + system time.
"""

import argparse
import base64
import hashlib
import http.client
import re
import urllib.parse
import json
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--owner", default="bench-boto3")
    ap.add_argument("--image", default="ami-760aaa0f")
    ap.add_argument("--raw", action="store_true")
    args = ap.parse_args()

    calls = 0
    lock = threading.Lock()
    user_data = base64.b64encode(b"#cloud-config\n" + b"# padding\n" * 203).decode()

    def count() -> None:
        nonlocal calls
        with lock:
            calls += 1

    if args.raw:
        creds = Credentials("testing", "testing")
        local = threading.local()
        url = urllib.parse.urlsplit(args.endpoint)

        def ec2(params: dict) -> str:
            count()
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(url.hostname, url.port)
            body = urllib.parse.urlencode({**params, "Version": "2016-11-15"})
            req = AWSRequest(
                method="POST",
                url=args.endpoint + "/",
                data=body,
                headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
            )
            SigV4Auth(creds, "ec2", "us-east-1").add_auth(req)
            conn.request("POST", "/", body=body, headers=dict(req.headers.items()))
            resp = conn.getresponse()
            text = resp.read().decode()
            if resp.status != 200:
                raise RuntimeError(f"{params['Action']}: {resp.status} {text[:200]}")
            return text

        def launch(name: str, token: str) -> str:
            params = {
                "Action": "RunInstances",
                "ImageId": args.image,
                "InstanceType": "t3.micro",
                "MinCount": "1",
                "MaxCount": "1",
                "ClientToken": token,
                "UserData": user_data,
            }
            tags = [("Name", name), ("machine-provisioning/managed", "true"),
                    ("machine-provisioning/owner", args.owner)]
            for n, rt in enumerate(["instance", "volume"], 1):
                params[f"TagSpecification.{n}.ResourceType"] = rt
                for m, (k, v) in enumerate(tags, 1):
                    params[f"TagSpecification.{n}.Tag.{m}.Key"] = k
                    params[f"TagSpecification.{n}.Tag.{m}.Value"] = v
            return re.search(r"<instanceId>([^<]+)</instanceId>", ec2(params)).group(1)

        def state(iid: str) -> str:
            text = ec2({"Action": "DescribeInstances", "InstanceId.1": iid})
            return re.search(r"<instanceState>\s*<code>\d+</code>\s*<name>([^<]+)</name>", text).group(1)

        def terminate(iid: str) -> None:
            ec2({"Action": "TerminateInstances", "InstanceId.1": iid})
    else:
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

        def launch(name: str, token: str) -> str:
            tags = [
                {"Key": "Name", "Value": name},
                {"Key": "machine-provisioning/managed", "Value": "true"},
                {"Key": "machine-provisioning/owner", "Value": args.owner},
            ]
            count()
            run = client.run_instances(
                ImageId=args.image,
                InstanceType="t3.micro",
                MinCount=1,
                MaxCount=1,
                ClientToken=token,
                UserData=base64.b64decode(user_data).decode(),
                TagSpecifications=[
                    {"ResourceType": "instance", "Tags": tags},
                    {"ResourceType": "volume", "Tags": tags},
                ],
            )
            return run["Instances"][0]["InstanceId"]

        def state(iid: str) -> str:
            count()
            d = client.describe_instances(InstanceIds=[iid])
            return d["Reservations"][0]["Instances"][0]["State"]["Name"]

        def terminate(iid: str) -> None:
            count()
            client.terminate_instances(InstanceIds=[iid])

    def one(i: int) -> None:
        name = f"bench-{i:04d}"
        token = hashlib.sha256(f"{args.owner}\0{name}".encode()).hexdigest()[:32] + "-0-0"
        iid = launch(name, token)
        while state(iid) != "running":
            time.sleep(0.2)
        terminate(iid)
        while state(iid) != "terminated":
            time.sleep(0.2)

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
