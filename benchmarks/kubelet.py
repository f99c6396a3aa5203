"""An outsider's preemption harness: a kubelet stand-in around ``flyte-checkpoint run``.

    python benchmarks/kubelet.py --store s3 --trials 8          # moto S3 started here
    python benchmarks/kubelet.py --store local --trials 8       # a relative local path
    python benchmarks/kubelet.py --store file --trials 8        # a file:// URI

Written apart from ``preemption.py`` and its supervisor, as someone else would test the feature:
each attempt is a fresh ``python -m flyte_checkpoint run`` in a session of its own, with
per-attempt locations (``…/{run}/a/{n}/checkpoint``, ``--run-name``/``--action-name``,
``FLYTE_ATTEMPT_NUMBER``) as a platform passes them. The first ``--preemptions`` attempts of a
run get SIGTERM at a uniformly random instant over the whole life of the process (start-up and
imports, the load, training, background saves, C calls, DataLoader fork workers), to the process
alone or to its whole group (half each), and SIGKILL ``--grace`` seconds later; the next attempt
is then started. The task (``_kubelet_task.py``) is the README's loop with random features.

Judged from the task's journal and from the stored objects, read back with ``flyte-checkpoint
get``: every attempt resumes from the newest object an earlier attempt stored (walking back
over attempts that stored nothing); no stored object is damaged; no attempt is SIGKILLed or
hangs (py-spy, when on PATH, dumps the stacks first); from the first save on a preempted attempt
loses at most one step (a save interval when the SIGTERM went to the whole group of a task with
DataLoader fork workers: they die with it and torch fails the step, as the preemption guide
says); the last attempt finishes with the final state stored; no fork child
outlives an attempt that exited by itself; no unfinished multipart upload is left (S3). Prints
one line per run and the findings; exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks.lib.processes import free_port

HERE = Path(__file__).resolve().parent
FEATURES = ("inplace", "fork", "cpu")
EXITS_OF_A_PREEMPTION = (0, 75, 143, -signal.SIGTERM)
"""Finished before the signal, preempted with or without a save committed after the notice (75,
143), or ended by the SIGTERM's default action before the handler was installed (start-up)."""


@dataclass
class Store:
    root: str
    options: list[str] = field(default_factory=list)
    endpoint: str | None = None


@dataclass
class Harness:
    args: argparse.Namespace
    store: Store
    work: Path
    rng: random.Random
    findings: list[str] = field(default_factory=list)


def _s3_client(endpoint: str) -> Any:
    import boto3  # type: ignore[import-untyped]  # moto's dependency

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            _s3_client(endpoint).create_bucket(Bucket="ckpts")
            return server, endpoint
        except Exception:  # not answering yet
            time.sleep(0.1)
    os.killpg(server.pid, signal.SIGKILL)
    raise SystemExit("moto's S3 server did not start within 60 s")


def _stacks(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return "(py-spy not on PATH: no stacks)"
    return subprocess.run(
        [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False
    ).stdout


def _group_members(pgid: int) -> list[int]:
    listed = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in listed.split()]


def _stored(harness: Harness, uri: str) -> dict[str, Any] | None:
    """The step stored at ``uri`` and whether its weights match it, read with the CLI's ``get``."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "flyte_checkpoint", "get", uri, f"{out}/r", "--quiet"]
        done = subprocess.run(
            [*command, *harness.store.options], cwd=HERE, capture_output=True, text=True, timeout=300
        )
        if done.returncode == 4:
            return None
        if done.returncode != 0:
            return {"error": done.returncode, "stderr": done.stderr.strip()[-300:]}
        meta = json.loads(Path(out, "r", "meta.json").read_text())
        weights = Path(out, "r", "weights.bin").read_bytes()
        return {"step": meta["step"], "intact": hashlib.sha256(weights).hexdigest() == meta["digest"]}


def _attempt(harness: Harness, run: str, number: int, inputs: dict[str, Any]) -> dict[str, Any]:
    args, store = harness.args, harness.store
    command = [sys.executable, "-m", "flyte_checkpoint", "run", "--run-name", run, "--action-name", "a"]
    command += ["--checkpoint-path", f"{store.root}/{run}/a/{number}/checkpoint"]
    if number:
        command += ["--prev-checkpoint", f"{store.root}/{run}/a/{number - 1}/checkpoint"]
    command += ["--grace-seconds", str(args.grace), *store.options, "_kubelet_task:train"]
    command += ["--inputs", json.dumps(inputs)]
    environment = dict(os.environ, FLYTE_ATTEMPT_NUMBER=str(number))
    preempt = number < args.preemptions
    at = harness.rng.uniform(0, args.latest_sigterm) if preempt else None
    to_group = harness.rng.random() < 0.5
    process = subprocess.Popen(
        command,
        cwd=HERE,
        env=environment,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    record: dict[str, Any] = {"attempt": number, "sigterm_at": at, "to_group": to_group, "killed": False}
    signalled = time.monotonic()
    try:
        process.wait(timeout=args.finish_timeout if at is None else at)
    except subprocess.TimeoutExpired:
        if at is not None:
            (os.killpg if to_group else os.kill)(process.pid, signal.SIGTERM)
            signalled = time.monotonic()
        try:
            process.wait(timeout=args.grace if at is not None else 0)
        except subprocess.TimeoutExpired:
            record["stacks"] = _stacks(process.pid)
            os.killpg(process.pid, signal.SIGKILL)
            record["killed"] = True
            process.wait()
    record["exit_s"] = round(time.monotonic() - signalled, 3)
    _, stderr = process.communicate()
    record["rc"] = process.returncode
    record["stderr"] = stderr.decode(errors="replace")[-600:]
    time.sleep(0.2)
    survivors = _group_members(process.pid)
    if survivors and not record["killed"]:
        record["survivors"] = len(survivors)
        os.killpg(process.pid, signal.SIGKILL)
    return record


def _run(harness: Harness, index: int) -> dict[str, Any]:
    args = harness.args
    run = f"run{index}-{harness.rng.randrange(1 << 30):x}"
    journal = harness.work / f"{run}.jsonl"
    features = [feature for feature in FEATURES if harness.rng.random() < args.feature_share]
    inputs = {"steps": args.steps, "mib": args.mib, "every": args.every, "step_s": args.step_s}
    inputs |= {"features": features, "journal": str(journal)}
    stored: dict[int, dict[str, Any] | None] = {}
    attempts = []
    for number in range(args.preemptions + 1):
        record = _attempt(harness, run, number, inputs)
        stored[number] = record["stored"] = _stored(
            harness, f"{harness.store.root}/{run}/a/{number}/checkpoint"
        )
        events = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
        mine = [e for e in events if e["attempt"] == number]
        _judge(harness, run, number, record, stored, mine, events, features)
        attempts.append(record)
        if record["rc"] == 0:
            break
    return {"run": run, "features": features, "attempts": attempts}


def _judge(
    harness: Harness,
    run: str,
    number: int,
    record: dict[str, Any],
    stored: dict[int, dict[str, Any] | None],
    mine: list[dict[str, Any]],
    events: list[dict[str, Any]],
    features: list[str],
) -> None:
    args = harness.args
    say = harness.findings.append
    name = f"{run} attempt {number}"
    newest = next((stored[k] for k in range(number - 1, -1, -1) if stored.get(k)), None)
    began = next((e for e in mine if e["event"] in ("resumed", "fresh")), None)
    if began is not None:
        resumed_at = began.get("step", 0)
        want = newest.get("step", 0) if newest else 0
        if resumed_at != want:
            say(f"{name}: resumed from step {resumed_at}, the newest stored was {want}")
        if began.get("intact") is False:
            say(f"{name}: the restored state does not match its step")
    own = stored[number]
    if own is not None and ("error" in own or not own.get("intact")):
        say(f"{name}: its stored object is damaged or unreadable: {own}")
    if record["killed"]:
        say(
            f"{name}: SIGKILLed {args.grace} s after its SIGTERM (at {record['sigterm_at']}); "
            f"stacks:\n{record['stacks']}"
        )
    if record.get("survivors"):
        say(f"{name}: {record['survivors']} processes of its group outlived it")
    done = max((e["step"] for e in mine if e["event"] == "step"), default=None)
    saved_before = any(e["event"] == "saved" for e in events if e["attempt"] <= number)
    kept = own if own is not None else newest
    record["lost"] = None if done is None or not kept or "step" not in kept else done - kept["step"]
    if record["sigterm_at"] is not None:
        if not record["killed"] and record["rc"] not in EXITS_OF_A_PREEMPTION:
            say(f"{name}: exit {record['rc']}: {record['stderr']}")
        # A SIGTERM to the whole group ends the DataLoader's fork workers too, and torch fails the
        # step in progress: the preemption guide documents up to a save interval lost there.
        allowed = args.every if record["to_group"] and "fork" in features else 1
        if saved_before and record["lost"] is not None and record["lost"] > allowed:
            say(f"{name}: {record['lost']} steps lost (done {done}, stored {kept})")
    elif record["rc"] != 0:
        say(f"{name}: the last attempt exited {record['rc']}: {record['stderr']}")
    elif own is None or own.get("step") != args.steps:
        say(f"{name}: the last attempt finished with {own} stored, not step {args.steps}")


def _store(args: argparse.Namespace, work: Path) -> tuple[Store, subprocess.Popen[bytes] | None]:
    if args.store == "s3":
        server, endpoint = _start_moto()
        options = ["-o", f"endpoint_url={endpoint}", "-o", "key=k", "-o", "secret=s"]
        return Store("s3://ckpts/runs", options, endpoint), server
    if args.store == "local":
        return Store(os.path.relpath(work / "ckpt", HERE)), None
    return Store((work / "ckpt").as_uri()), None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["s3", "local", "file"], default="s3")
    parser.add_argument("--trials", type=int, default=8, help="runs, each to its last step")
    parser.add_argument("--preemptions", type=int, default=2, help="preempted attempts per run")
    parser.add_argument("--grace", type=float, default=4.0, help="seconds from SIGTERM to SIGKILL")
    parser.add_argument(
        "--latest-sigterm", type=float, default=8.0, help="SIGTERM at 0..this s after the start"
    )
    parser.add_argument("--mib", type=int, default=32, help="size of the weights file")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5, help="a background save every this many steps")
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--feature-share", type=float, default=0.5, help="chance of each feature per run")
    parser.add_argument("--finish-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json-out", type=Path, default=None, help="every run's record, one JSON line each")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    work = Path(tempfile.mkdtemp(prefix="kubelet-"))
    store, server = _store(args, work)
    harness = Harness(args, store, work, random.Random(seed))
    print(f"seed {seed}; store {store.root}; grace {args.grace} s; {args.mib} MiB of weights", flush=True)
    try:
        for index in range(args.trials):
            report = _run(harness, index)
            if args.json_out is not None:
                with args.json_out.open("a") as out:
                    out.write(json.dumps(report) + "\n")
            brief = [
                (a["rc"], a["sigterm_at"] and round(a["sigterm_at"], 2), a["lost"])
                for a in report["attempts"]
            ]
            print(
                f"{report['run']} {report['features']}: (exit, SIGTERM at s, steps lost) {brief}", flush=True
            )
        if store.endpoint is not None:
            left = _s3_client(store.endpoint).list_multipart_uploads(Bucket="ckpts").get("Uploads", [])
            if left:
                harness.findings.append(f"{len(left)} unfinished multipart uploads left")
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(harness.findings)} findings", *harness.findings, sep="\n")
    return 1 if harness.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
