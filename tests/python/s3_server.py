"""A moto S3 server for the tests (test_s3.py, test_shard_writer.py): started on 127.0.0.1 only,
with request authentication on and a bucket, and a key of an IAM user allowed everything.
Needs moto[server] and boto3 (scripts/install-deps.sh installs them); import it after
pytest.importorskip("boto3") / ("moto")."""

from __future__ import annotations

import json
import os
import socket as socketlib
import subprocess
import sys
import time
from pathlib import Path

import boto3

BUCKET = "spdl-test"


def free_port() -> int:
    s = socketlib.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Moto:
    """A moto S3 server on 127.0.0.1 with request authentication on (after the IAM setup)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")  # create_user, put_user_policy, create_access_key
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(k, None)
        self.log = open(tmp / "moto.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                socketlib.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, (tmp / "moto.log").read_text()
                time.sleep(0.1)
        kw = dict(endpoint_url=self.url, region_name="us-east-1")
        iam = boto3.client("iam", aws_access_key_id="setup", aws_secret_access_key="setup", **kw)
        iam.create_user(UserName="trainer")
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        self.s3 = boto3.client("s3", aws_access_key_id=self.key_id, aws_secret_access_key=self.secret, **kw)
        self.s3.create_bucket(Bucket=BUCKET)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
