"""Where the preemption benchmark's checkpoints are stored (local disk, shaped S3), and peeks at them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import _preemption_trainer as trainer  # stdlib-only at module level
from benchmarks import netshape, s3server
from benchmarks.lib.attempts import HarnessError
from benchmarks.lib.preemption_plan import HERE, PEEK_BYTES
from benchmarks.lib.preemption_results import Peek


def step_in(prefix: bytes) -> Peek:
    """The step in ``0-meta.json``, the first member of a ``.tar.gz`` of which ``prefix`` is the start."""
    if not prefix:
        return Peek("none")
    try:
        data, rest = b"", prefix
        while rest and len(data) < PEEK_BYTES:
            inflate = zlib.decompressobj(wbits=31)
            data += inflate.decompress(rest)
            rest = inflate.unused_data
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
            member = archive.next()
            if member is None or member.name.removeprefix("./") != trainer.META:
                return Peek("unreadable")
            content = archive.extractfile(member)
            assert content is not None
            return Peek("ok", int(json.loads(content.read())["step"]))
    except Exception:
        return Peek("unreadable")


class Store:
    """A place for checkpoints: URIs for the job, and the platform's own reads and copies."""

    name = ""
    storage_options: dict[str, Any] | None = None
    """What ours is given to reach the store."""
    env: dict[str, str] = {}  # noqa: RUF012 - replaced per instance, never mutated
    """The environment the reference reads its storage configuration from."""
    settle_s = 0.0
    """How long bytes a process sent can still be on their way after it ended."""

    def uri(self, key: str) -> str:
        raise NotImplementedError

    def head(self, key: str) -> bytes | None:
        """The object's first bytes, or ``None`` if there is no object."""
        raise NotImplementedError

    def stage(self, src: str, dst: str) -> bool:
        """Copy ``src`` to ``dst`` as the platform does between attempts; ``False`` if ``src`` is absent."""
        raise NotImplementedError

    def peek(self, key: str) -> Peek:
        head = self.head(key)
        return Peek("none") if head is None else step_in(head)


class LocalStore(Store):
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root

    def uri(self, key: str) -> str:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        return str(path)

    def head(self, key: str) -> bytes | None:
        try:
            with open(self.root / key, "rb") as stored:
                return stored.read(PEEK_BYTES)
        except FileNotFoundError:
            return None

    def stage(self, src: str, dst: str) -> bool:
        source, target = self.root / src, self.root / dst
        partial = target.with_name(f".{target.name}.staging")
        try:
            shutil.copy2(source, partial)  # copy2: the extended attributes ours records go along
        except FileNotFoundError:
            return False
        os.replace(partial, target)
        return True


class S3Store(Store):
    """A bucket on s3rver: the job reaches it through the shaping proxy, the platform directly."""

    name = "s3"

    def __init__(
        self, server: s3server.S3Server, proxy_endpoint: str, rate_mib: float, rtt_ms: float
    ) -> None:
        import boto3  # type: ignore[import-untyped]

        # What the proxy holds for a connection (like a client's TCP send buffer) drains at the
        # line's rate after the client is gone: a request sent whole can still commit then.
        self.settle_s = (
            netshape.QUEUE_CHUNKS * netshape.READ_BYTES / (rate_mib * netshape.MIB) + rtt_ms / 1000 + 0.1
        )

        self.bucket = server.bucket
        self.client = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            aws_access_key_id=server.key,
            aws_secret_access_key=server.secret,
            region_name=s3server.REGION,
        )
        self.storage_options = {
            "key": server.key,
            "secret": server.secret,
            "client_kwargs": {"endpoint_url": proxy_endpoint, "region_name": s3server.REGION},
        }
        self.env = {  # the reference's storage configuration (what objectstore.py gives it)
            "FLYTE_AWS_ENDPOINT": proxy_endpoint,
            "FLYTE_AWS_ACCESS_KEY_ID": server.key,
            "FLYTE_AWS_SECRET_ACCESS_KEY": server.secret,
            "AWS_REGION": s3server.REGION,
            "AWS_DEFAULT_REGION": s3server.REGION,
        }

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _get(self, key: str, **extra: Any) -> dict[str, Any] | None:
        try:
            response: dict[str, Any] = self.client.get_object(Bucket=self.bucket, Key=key, **extra)
        except self.client.exceptions.NoSuchKey:
            return None
        return response

    def head(self, key: str) -> bytes | None:
        response = self._get(key, Range=f"bytes=0-{PEEK_BYTES - 1}")
        return None if response is None else bytes(response["Body"].read())

    def stage(self, src: str, dst: str) -> bool:
        # Streamed through this process (s3rver does not copy objects completed from parts),
        # metadata included, as a server-side CopyObject keeps it.
        response = self._get(src)
        if response is None:
            return False
        self.client.put_object(
            Bucket=self.bucket,
            Key=dst,
            Body=response["Body"].read(),
            Metadata=response.get("Metadata", {}),
            ContentType=response.get("ContentType", "application/octet-stream"),
        )
        return True


@contextlib.contextmanager
def shaped_proxy(upstream: int, rate_mib: float, rtt_ms: float, log_dir: Path) -> Iterator[str]:
    """``netshape.py`` in a process of its own (the supervisor's threads never slow it down)."""
    command = [
        sys.executable,
        str(HERE / "netshape.py"),
        f"--upstream={upstream}",
        f"--rate-mib={rate_mib}",
        f"--rtt-ms={rtt_ms}",
    ]
    with open(log_dir / "netshape.log", "wb") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("http://"):
            raise HarnessError(f"netshape.py did not start: {line!r}")
        yield line.split()[0]
    finally:
        process.send_signal(signal.SIGINT)  # it prints its counters and stops on Ctrl-C
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
