"""The benchmarks' generated inputs: deterministic, seeded, cached under ``benchmarks/.data`` with a
manifest each, and every run's private directory beside them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._worker import tree_digest
from benchmarks.lib.report import log

DATA_ROOT = Path(__file__).resolve().parents[1] / ".data"
MIB = 1 << 20
BIG_FILE_BYTES = 48 * MIB
TEXT_FILES = 200
PAYLOAD_BYTES = 1024
DATA_FORMAT_VERSION = 1
SEED = 20240601


def _random_bytes(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def _text_pool(rng: random.Random, size: int) -> bytes:
    """Seeded JSON-lines and prose-like text, about as compressible as logs and configs."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "si", "vo", "de", "pa", "ex", "ion", "ter", "al"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    lines: list[str] = []
    total = 0
    step = 0
    while total < size:
        step += 1
        if rng.random() < 0.6:
            record = {
                "step": step,
                "loss": round(rng.uniform(0.01, 4.0), 6),
                "lr": round(rng.uniform(1e-6, 1e-3), 9),
                "tokens": " ".join(rng.choices(words, k=rng.randint(4, 16))),
                "grad_norm": round(rng.gauss(1.0, 0.3), 5),
            }
            line = json.dumps(record)
        else:
            line = " ".join(rng.choices(words, k=rng.randint(6, 24))).capitalize() + "."
        lines.append(line)
        total += len(line) + 1
    return ("\n".join(lines) + "\n").encode()[:size]


@dataclass
class Dataset:
    """One generated input: its path, content size and tree digest."""

    kind: str
    path: Path
    size_bytes: int
    digest: str
    files: int


def _manifest_ok(manifest: Path, expected: dict[str, Any]) -> dict[str, Any] | None:
    try:
        recorded: dict[str, Any] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if all(recorded.get(key) == value for key, value in expected.items()):
        return recorded
    return None


def new_run_dir(name: str) -> Path:
    """A fresh directory of this run's own under ``DATA_ROOT`` (``name-pid-random``)."""
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    run_dir = DATA_ROOT / f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir()
    return run_dir


@contextlib.contextmanager
def _data_lock() -> Iterator[None]:
    """Serialise checking and generating data between concurrent runs (e.g. two smoke tests)."""
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    with open(DATA_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_dataset(
    kind: str, target: Path, expected: dict[str, Any], build: Callable[[Path], None]
) -> Dataset:
    with _data_lock():
        return _write_dataset_locked(kind, target, expected, build)


def _write_dataset_locked(
    kind: str, target: Path, expected: dict[str, Any], build: Callable[[Path], None]
) -> Dataset:
    manifest = target.with_name(target.name + ".json")
    recorded = _manifest_ok(manifest, expected)
    if recorded is not None and target.exists():
        return Dataset(kind, target, recorded["size_bytes"], recorded["digest"], recorded["files"])
    log(f"generating {kind} data at {target} ...")
    started = time.perf_counter()
    manifest.unlink(missing_ok=True)
    remove(target)
    partial = target.with_name(target.name + ".partial")
    remove(partial)
    build(partial)
    partial.rename(target)
    size, files = _content_size(target)
    digest = tree_digest(target)
    manifest.write_text(json.dumps({**expected, "size_bytes": size, "digest": digest, "files": files}))
    log(f"  {size / MIB:.1f} MiB in {files} file(s), {time.perf_counter() - started:.1f} s")
    return Dataset(kind, target, size, digest, files)


def make_dir_dataset(size_mib: int) -> Dataset:
    """A model-checkpoint-like tree: 48 MiB random shards plus ~200 text/JSON files, nested."""
    total = size_mib * MIB
    big_count = max(1, round(total * 0.75 / BIG_FILE_BYTES))
    big_size = min(BIG_FILE_BYTES, int(total * 0.75) // big_count)
    text_total = max(TEXT_FILES * 64, total - big_count * big_size)
    expected = {"format": DATA_FORMAT_VERSION, "seed": SEED, "size_mib": size_mib, "kind": "dir"}

    def build(root: Path) -> None:
        rng = random.Random(SEED)
        weights = root / "model"
        weights.mkdir(parents=True)
        for index in range(big_count):
            name = f"model-{index + 1:05d}-of-{big_count:05d}.safetensors"
            (weights / name).write_bytes(_random_bytes(rng, big_size))
        pool = _text_pool(rng, min(8 * MIB, max(64 * 1024, text_total)))
        shares = [rng.uniform(0.2, 1.8) for _ in range(TEXT_FILES)]
        scale = text_total / sum(shares)
        sizes = [max(64, int(share * scale)) for share in shares]
        sizes[-1] += text_total - sum(sizes)
        layout = [
            ("config", "json"),
            ("tokenizer", "json"),
            ("optimizer/state", "json"),
            ("logs/train", "jsonl"),
            ("logs/eval", "jsonl"),
            ("notes", "txt"),
        ]
        for index, file_size in enumerate(sizes):
            folder, suffix = layout[index % len(layout)]
            directory = root / folder / f"group-{index % 7:02d}" / f"part-{index % 3}"
            directory.mkdir(parents=True, exist_ok=True)
            offset = rng.randrange(len(pool))
            content = bytearray()
            while len(content) < file_size:
                content += pool[offset : offset + file_size - len(content)]
                offset = 0
            (directory / f"file-{index:03d}.{suffix}").write_bytes(bytes(content))
        (root / "config.json").write_text(json.dumps({"shards": big_count, "seed": SEED}, indent=2))

    return _write_dataset("dir", DATA_ROOT / f"dir-{size_mib}mib", expected, build)


def make_file_dataset(size_mib: int) -> Dataset:
    """One large incompressible file (like a single weights file)."""
    expected = {"format": DATA_FORMAT_VERSION, "seed": SEED, "size_mib": size_mib, "kind": "file"}

    def build(path: Path) -> None:
        rng = random.Random(SEED + 1)
        with open(path, "wb") as out:
            remaining = size_mib * MIB
            while remaining:
                chunk = min(remaining, 64 * MIB)
                out.write(_random_bytes(rng, chunk))
                remaining -= chunk

    return _write_dataset("file", DATA_ROOT / f"file-{size_mib}mib.bin", expected, build)


def make_bytes_dataset() -> Dataset:
    expected = {"format": DATA_FORMAT_VERSION, "seed": SEED, "size_bytes": PAYLOAD_BYTES, "kind": "bytes"}

    def build(path: Path) -> None:
        path.write_bytes(random.Random(SEED + 2).randbytes(PAYLOAD_BYTES))

    return _write_dataset("bytes", DATA_ROOT / "payload-1kib.bin", expected, build)


def _content_size(root: Path) -> tuple[int, int]:
    if root.is_file():
        return root.stat().st_size, 1
    files = [path for path in root.rglob("*") if path.is_file()]
    return sum(path.stat().st_size for path in files), len(files)


def remove(path: Path) -> None:
    """Remove a file or a whole directory; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
