"""One measured operation for ``objectstore.py``, in a fresh process.

Usage: ``python _objectstore_worker.py '<json spec>'``; prints one JSON object (the last line).

* ``impl`` "ours" / "reference": ``_worker.py``'s measurement, unchanged, except that right after
  its warm-up this process waits for the requests the warm-up left running in the background
  (ours opens the destination's client after a load) and tells the shaping proxy to start
  counting (``NETSHAPE_MARK_PORT``), so requests and connections of the warm-up are not charged
  to the operation; ours' ``close`` after the operation waits for its background requests too.
* ``impl`` "boto3": a plain parallel client (s3transfer, ``threads`` threads) saving or loading
  the file, for the same figures; for 1 KiB, one ``put_object`` / ``get_object`` per call
  (median of ``reps``, no ``Expect: 100-continue``): the per-request cost of botocore itself,
  the client ours is built on.
* ``op`` "ceiling": the S3 server's own speed without the proxy: multipart upload with 8 parts in
  flight, CompleteMultipartUpload, and 8 ranged GETs in flight.

Like ``_worker.py`` it imports only the standard library at module level, so it runs under the
reference's interpreter too.
"""

from __future__ import annotations

import os
import pathlib
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks import _worker
else:
    # Run by path, possibly under the reference's virtual environment: only this directory is on
    # sys.path (never the repo root, whose flyte_checkpoint would shadow the installed one).
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import _worker  # stdlib-only at module level

MIB = 1 << 20
PART_BYTES = 8 * MIB
CEILING_PARALLEL = 8
CEILING_PART_BYTES = 16 * MIB


def mark_start() -> None:
    """Ask the proxy to reset its counters, and wait until it has (it closes the connection)."""
    port = os.environ.get("NETSHAPE_MARK_PORT")
    if not port:
        return
    with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as mark:
        while mark.recv(64):
            pass


BACKGROUND_THREADS = ("flyte-checkpoint-open-destination", "flyte-checkpoint-earlier-uploads")
"""Ours' background requests after a first load (a HEAD that readies the destination's client).
The warm-up's, left running, overlapped the measured operation (a HEAD and a connection more in
some runs); the operation's own, racing the process's exit, found the pool's connections closing
and opened one more (9 counted for a load on 8), which a task that lives on never does."""


def _finish_background_requests(timeout_s: float = 30.0) -> None:
    for thread in threading.enumerate():
        if thread.name.startswith(BACKGROUND_THREADS):
            thread.join(timeout_s)


def _warm_up_then_mark(impl: Any, uri: str) -> None:
    _original_warm_up(impl, uri)
    _finish_background_requests()
    mark_start()


def _close_after_background_requests(self: Any, checkpoint: Any) -> None:
    """Ours' ``close``, once the measured operation's background requests are done."""
    _finish_background_requests()
    _original_close(self, checkpoint)


_original_warm_up = _worker._warm_up
_worker._warm_up = _warm_up_then_mark
_original_close = _worker.Ours.close
_worker.Ours.close = _close_after_background_requests  # type: ignore[method-assign]


def _client(spec: dict[str, Any], threads: int) -> Any:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config

    options = spec["storage_options"]
    return boto3.client(
        "s3",
        endpoint_url=spec.get("endpoint_url") or options["client_kwargs"]["endpoint_url"],
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name=options["client_kwargs"].get("region_name", "us-east-1"),
        config=Config(max_pool_connections=threads + 4, retries={"max_attempts": 3}),
    )


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _small_object_calls(client: Any, spec: dict[str, Any]) -> list[float]:
    """``reps`` timed single requests of the 1 KiB object: PutObject or GetObject.

    Without ``Expect: 100-continue`` (a round trip of its own, which ours does not send either),
    so what is left is botocore's per-request work.
    """
    from botocore.handlers import add_expect_header

    client.meta.events.unregister("before-call.s3", add_expect_header)
    if spec["op"] == "save":
        bucket, key = _split(spec["dest"])
        data = pathlib.Path(spec["data"]).read_bytes()

        def call() -> None:
            client.put_object(Bucket=bucket, Key=key, Body=data)

    else:
        bucket, key = _split(spec["src"])

        def call() -> None:
            client.get_object(Bucket=bucket, Key=key)["Body"].read()

    times: list[float] = []
    for _ in range(int(spec.get("reps", 1))):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def run_boto3(spec: dict[str, Any]) -> dict[str, Any]:
    from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]

    threads = int(spec.get("threads", 16))
    client = _client(spec, threads)
    config = TransferConfig(
        multipart_threshold=PART_BYTES,
        multipart_chunksize=PART_BYTES,
        max_concurrency=threads,
        use_threads=True,
    )
    warm_bucket, warm_key = _split(spec["warmup_uri"])
    client.put_object(Bucket=warm_bucket, Key=warm_key, Body=b"w" * 1024)
    client.get_object(Bucket=warm_bucket, Key=warm_key)["Body"].read()
    mark_start()
    if spec["kind"] == "bytes":
        times = _small_object_calls(client, spec)
        return {
            "impl": "boto3",
            "wall_s": statistics.median(times),
            "rep_min_s": min(times),
            "peak_rss_mib": _worker._peak_rss_mib(),
            "reps": len(times),
        }
    if spec["op"] == "save":
        bucket, key = _split(spec["dest"])
        started = time.perf_counter()
        client.upload_file(spec["data"], bucket, key, Config=config)
    else:
        bucket, key = _split(spec["src"])
        target = pathlib.Path(tempfile.mkdtemp()) / "download.bin"  # removed with TMPDIR's dirs
        started = time.perf_counter()
        client.download_file(bucket, key, str(target), Config=config)
    wall = time.perf_counter() - started
    return {"impl": "boto3", "wall_s": wall, "peak_rss_mib": _worker._peak_rss_mib(), "reps": 1}


def run_ceiling(spec: dict[str, Any]) -> dict[str, Any]:
    """Multipart upload and ranged download at 8 in flight, straight to the server."""
    client = _client(spec, CEILING_PARALLEL)
    bucket, key = _split(spec["dest"])
    path = spec["data"]
    size = os.path.getsize(path)
    offsets = list(range(0, size, CEILING_PART_BYTES))

    def read_part(offset: int) -> bytes:
        with open(path, "rb") as source:
            source.seek(offset)
            return source.read(CEILING_PART_BYTES)

    upload = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"bench": "ceiling"})
    upload_id = upload["UploadId"]

    def put_part(numbered: tuple[int, int]) -> dict[str, Any]:
        number, offset = numbered
        answer = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=read_part(offset)
        )
        return {"PartNumber": number, "ETag": answer["ETag"]}

    started = time.perf_counter()
    with ThreadPoolExecutor(CEILING_PARALLEL) as pool:
        parts = list(pool.map(put_part, enumerate(offsets, start=1)))
    uploaded = time.perf_counter()
    done = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    completed = time.perf_counter()
    etag = done["ETag"]

    def get_range(offset: int) -> int:
        end = min(size, offset + CEILING_PART_BYTES) - 1
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}", IfMatch=etag)["Body"]
        received = 0
        while chunk := body.read(MIB):
            received += len(chunk)
        return received

    got = time.perf_counter()
    with ThreadPoolExecutor(CEILING_PARALLEL) as pool:
        received = sum(pool.map(get_range, offsets))
    fetched = time.perf_counter()
    if received != size:
        raise RuntimeError(f"ranged GETs returned {received} bytes of {size}")
    client.delete_object(Bucket=bucket, Key=key)
    return {
        "impl": "ceiling",
        "upload_mib_s": size / MIB / (uploaded - started),
        "complete_s": completed - uploaded,
        "download_mib_s": size / MIB / (fetched - got),
        "wall_s": fetched - started,
        "peak_rss_mib": _worker._peak_rss_mib(),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["op"] == "ceiling":
        return run_ceiling(spec)
    if spec["impl"] == "boto3":
        return run_boto3(spec)
    return _measure(spec)


# _worker.main prints the result or the error and empties TMPDIR; it calls our run.
_measure = _worker.run
_worker.run = run

if __name__ == "__main__":
    sys.exit(_worker.main(sys.argv))
