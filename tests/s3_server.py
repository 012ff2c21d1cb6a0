"""A real S3 server for the tests: moto in server mode, in its own process, on loopback.

``with MotoServer() as s3: s3.create_bucket("b")``; ``s3.env`` is the environment a client
needs (endpoint, test credentials, no instance-metadata lookups). With ``auth=True`` the server
checks every request's signature against an IAM user it creates first (moto's
``INITIAL_NO_AUTH_ACTION_COUNT``), so wrong credentials are refused as AWS refuses them.
The tests that use it start it themselves (a module fixture) and it stops with them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from hallulog.contracts.process import die_with_parent

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    def __init__(self, auth: bool = False) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.auth = auth
        self.access_key, self.secret_key = ACCESS_KEY, SECRET_KEY
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """Client environment: this endpoint, the test keys, no metadata service lookups."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def __enter__(self) -> MotoServer:
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3" if self.auth else "inf"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            preexec_fn=die_with_parent,  # a crashed test run leaves no server behind
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("moto server did not start in 60 s") from None
                time.sleep(0.1)
        if self.auth:  # the three unauthenticated actions: a user, its policy, its key
            import boto3

            iam = boto3.client(
                "iam",
                endpoint_url=self.endpoint,
                aws_access_key_id="setup",
                aws_secret_access_key="setup",
                region_name="us-east-1",
            )
            iam.create_user(UserName="hallulog-test")
            iam.put_user_policy(
                UserName="hallulog-test",
                PolicyName="all",
                PolicyDocument=(
                    '{"Version": "2012-10-17", "Statement": '
                    '[{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
                ),
            )
            key = iam.create_access_key(UserName="hallulog-test")["AccessKey"]
            self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self, access_key: str | None = None, secret_key: str | None = None):
        """A boto3 client of this server (test set-up and independent checks only)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name="us-east-1",
        )

    def create_bucket(self, name: str, versioned: bool = False) -> None:
        c = self.client()
        c.create_bucket(Bucket=name)
        if versioned:
            c.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
