"""What the S3 tests (test_s3.py, test_shard_cache.py, test_s3_addressing.py, test_shard_writer.py)
share: a moto S3 server started on 127.0.0.1 only, with request authentication on, a bucket and the
key of an IAM user allowed everything; tar shards of the test dataset; the trainer's environment
for the client; and the base of the tests' HTTP proxies in front of moto.
Needs moto[server] and boto3 (scripts/install-deps.sh installs them): a test module calls
require_moto() first (it skips, visibly, without them); this module itself imports without them.
Not thread-safe, except Proxy (below)."""

from __future__ import annotations

import io
import json
import os
import socket as socketlib
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

BUCKET = "spdl-test"
REGION = "us-east-1"
# The AWS settings a test clears unless it sets them itself (besides the key pair and endpoint).
OTHER_AWS_VARS = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3")
# An IAM policy allowing everything.
ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def require_moto():
    """Skips the calling test module (or fixture) unless boto3 and moto are installed; returns boto3."""
    reason = "the s3 tests need moto[server] (scripts/install-deps.sh installs it)"
    boto3 = pytest.importorskip("boto3", reason=reason)
    pytest.importorskip("moto", reason=reason)
    return boto3


def free_port() -> int:
    s = socketlib.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _add_user(iam, name: str, policy: dict) -> dict:
    """Creates IAM user `name` with `policy` inline; returns its new access key (AccessKeyId, SecretAccessKey)."""
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="policy", PolicyDocument=json.dumps(policy))
    return iam.create_access_key(UserName=name)["AccessKey"]


class Moto:
    """A moto S3 server on 127.0.0.1 with request authentication on (after the IAM setup), its log
    in tmp/moto.log, the bucket BUCKET, and the key (key_id, secret) of user "trainer", allowed
    everything; s3 is a boto3 client with that key. Stopped by close() (or leaving a with block)."""

    def __init__(self, tmp: Path) -> None:
        import boto3

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
        setup = boto3.client("iam", endpoint_url=self.url, region_name=REGION, aws_access_key_id="setup",
                             aws_secret_access_key="setup")
        key = _add_user(setup, "trainer", ALLOW_ALL)
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        self.s3 = self.client("s3")
        self.s3.create_bucket(Bucket=BUCKET)

    def client(self, service: str):
        """A boto3 client of `service` on this server with the trainer's key."""
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=REGION, aws_access_key_id=self.key_id,
                            aws_secret_access_key=self.secret)

    def add_user(self, name: str, policy: dict) -> dict:
        """A new IAM user with `policy`; returns its access key (AccessKeyId, SecretAccessKey)."""
        return _add_user(self.client("iam"), name, policy)

    def temporary_credentials(self, role: str, session: str) -> dict:
        """Credentials (AccessKeyId, SecretAccessKey, SessionToken) of a session of a new role
        `role` allowed everything, assumed with the trainer's key."""
        iam = self.client("iam")
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                         "Action": "sts:AssumeRole"}]}
        arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        iam.put_role_policy(RoleName=role, PolicyName="all", PolicyDocument=json.dumps(ALLOW_ALL))
        return self.client("sts").assume_role(RoleArn=arn, RoleSessionName=session)["Credentials"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self) -> Moto:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def use_trainer_credentials(monkeypatch, moto: Moto, home: Path, endpoint: str | None = None) -> None:
    """The trainer's environment for this process's client: moto's key, `endpoint` (default moto's
    URL), region us-east-1, HOME=home (so no ~/.aws of the machine's user), and none of
    OTHER_AWS_VARS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint or moto.url)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("HOME", str(home))
    for k in OTHER_AWS_VARS:
        monkeypatch.delenv(k, raising=False)


def make_tar(members: list) -> bytes:
    """A USTAR tar of [(name, bytes), ...], in that order, every mtime 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def dataset_shard(dataset, rels: list) -> bytes:
    """A tar shard of the dataset's files `rels` (relative paths): per file, the image under its own
    path and its label as KEY.cls (KEY: the path without its extension)."""
    members = []
    for rel in rels:
        members.append((rel, (dataset.root / rel).read_bytes()))
        members.append((rel.rsplit(".", 1)[0] + ".cls", str(dataset.label_of[rel]).encode()))
    return make_tar(members)


def read_head(s) -> bytes:
    """What `s` sends up to and including the end of an HTTP head (less at EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data


def content_length(head: bytes) -> int:
    """The Content-Length of an HTTP head (0 without one)."""
    length = 0
    for h in head.split(b"\r\n")[1:]:
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    return length


def read_message(s) -> bytes:
    """One HTTP message from `s`: its head and Content-Length bytes of body (less at EOF)."""
    data = read_head(s)
    head = data.split(b"\r\n\r\n", 1)[0]
    length = content_length(head)
    while len(data) < len(head) + 4 + length:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class Proxy:
    """The base of the tests' HTTP proxies to a server on 127.0.0.1 (upstream_port): listens on an
    ephemeral port of 127.0.0.1 (url), and handles each connection on a thread of its own with the
    subclass's handle(conn) (one request per connection; an OSError ends the connection quietly;
    the connection is closed after). lock guards what subclasses count; close() stops listening.
    A subclass sets its own fields before calling Proxy.__init__ (which starts serving)."""

    def __init__(self, upstream_port: int, backlog: int = 64) -> None:
        self.upstream_port = upstream_port
        self.sock = socketlib.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def handle(self, conn) -> None:
        raise NotImplementedError

    def upstream(self):
        """A new connection to the upstream server."""
        return socketlib.create_connection(("127.0.0.1", self.upstream_port))

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn) -> None:
        try:
            self.handle(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()
