"""What a preemption run records: each preemption, attempt, run and configuration's result."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.lib.preemption_plan import BAD_VERDICTS, Config


@dataclass
class Peek:
    """The step of a stored checkpoint, read from its first member (``0-meta.json``)."""

    status: str  # "ok", "none" (no object) or "unreadable"
    step: int | None = None

    def describe(self) -> str:
        return str(self.step) if self.status == "ok" else self.status


@dataclass
class Preemption:
    """One SIGTERM and what came of it (filled in once the next attempt has resumed)."""

    config: str
    run: int
    attempt: int
    delay_s: float
    at_sigterm: Peek
    in_flight: int | None
    """The newest save the checkpoint library had in hand at the SIGTERM (a blocking
    ``save_sync`` under way, or a background one that had returned), if the stored checkpoint
    did not hold it yet."""
    preparing: int | None
    """A newer save not in the library's hands yet: the job was writing its state directory, or
    inside a background ``save_sync`` taking its snapshot."""
    steps_done: int
    exit: str
    exit_code: int | None
    exit_after_s: float
    exception: str | None
    at_exit: Peek | None = None
    """The stored checkpoint right after the process ended."""
    called: int | None = None
    """The newest save the job had called ``save_sync`` for before the SIGTERM, if the stored
    checkpoint did not hold it yet (whatever the library had done with it)."""
    called_kept: bool | None = None
    """The next attempt resumed from ``called`` or newer (``None``: no such save)."""
    situation: bool | None = None
    """A scenario's SIGTERM landed where it was meant to (``None``: a plain configuration)."""
    late: bool = False
    """A process of the attempt (the job or a child it forked) still ran at G: a SIGKILL."""
    hang: bool = False
    """... and still ran ``HANG_PROBE_S`` (or 3 G) later: it would never have ended."""
    children_left: int = 0
    """Processes of the attempt's group other than the job still running when the job ended."""
    sent_at: float = 0.0
    """The SIGTERM's instant (``time.monotonic()``, the event logs' clock)."""
    late_commit: bool = False
    """A save committed after the process had ended (its bytes were still on their way)."""
    resumed: int = 0
    verdict: str = "?"
    detail: str = ""
    steps_lost: int = 0
    committed_in_grace: bool = False
    previous_survived: bool = False
    restart_s: float = 0.0
    wasted_s: float = 0.0


@dataclass
class AttemptRecord:
    number: int
    spawned: float
    events: list[dict[str, Any]]
    ended: float
    exit_code: int | None
    staged: Peek | None
    preemption: Preemption | None = None

    def first(self, name: str) -> dict[str, Any] | None:
        return next((event for event in self.events if event["e"] == name), None)

    @property
    def resumed(self) -> dict[str, Any]:
        event = self.first("resumed")
        assert event is not None
        return event

    @property
    def finished(self) -> bool:
        return self.exit_code == 0 and self.first("done") is not None

    @property
    def resumed_step(self) -> int:
        """The step it resumed at; one preempted before that, the step it was given."""
        event = self.first("resumed")
        if event is not None:
            return int(event["step"])
        return max(0, committed_step(self.staged)) if self.staged is not None else 0

    def last_step(self) -> int:
        steps = [int(event["step"]) for event in self.events if event["e"] == "step"]
        return steps[-1] if steps else self.resumed_step

    def step_done_at(self, step: int) -> float | None:
        return next((e["t"] for e in self.events if e["e"] == "step" and e["step"] == step), None)

    def seconds_per_step(self, default: float) -> float:
        """Wall time per step of this attempt's training, saves included."""
        steps = [event for event in self.events if event["e"] == "step"]
        if not steps or self.first("resumed") is None:
            return default
        return float(steps[-1]["t"] - self.resumed["t"]) / len(steps)


@dataclass
class RunResult:
    index: int
    attempts: int
    finished: bool
    final_step: int
    model_matches: bool | None
    wall_s: float
    longest_stall: int
    """The most consecutive attempts that resumed no later than the one before."""


@dataclass
class ConfigResult:
    config: Config
    preemptions: list[Preemption] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    blocking_saves_s: list[float] = field(default_factory=list)
    """Ours' blocking saves after a notice (the one-line change), from ``save`` to ``saved``."""
    wall_s: float = 0.0
    error: str | None = None

    def count(self, test: Callable[[Preemption], bool]) -> int:
        return sum(1 for p in self.preemptions if test(p))

    def summary(self) -> dict[str, Any]:
        lost = [p.steps_lost for p in self.preemptions]
        in_flight = [p for p in self.preemptions if p.in_flight is not None]
        return {
            "name": self.config.name,
            **asdict(self.config),
            "error": self.error,
            "wall_s": self.wall_s,
            "preemptions": len(self.preemptions),
            "steps_lost_total": sum(lost),
            "steps_lost_max": max(lost, default=0),
            "steps_lost_mean": statistics.mean(lost) if lost else None,
            "committed_in_grace": self.count(lambda p: p.committed_in_grace),
            "in_flight_at_sigterm": len(in_flight),
            "in_flight_survived": sum(1 for p in in_flight if p.committed_in_grace),
            "previous_survived": self.count(lambda p: p.previous_survived),
            "bad": {
                verdict: sum(1 for p in self.preemptions if p.verdict == verdict) for verdict in BAD_VERDICTS
            },
            "exited_by_itself": self.count(lambda p: p.exit != "SIGKILL"),
            "late_commits": self.count(lambda p: p.late_commit),
            "wasted_s_total": sum(p.wasted_s for p in self.preemptions),
            "wasted_s_mean": statistics.mean(p.wasted_s for p in self.preemptions)
            if self.preemptions
            else None,
            "restart_s_median": statistics.median(p.restart_s for p in self.preemptions)
            if self.preemptions
            else None,
            "blocking_save_s_median": statistics.median(self.blocking_saves_s)
            if self.blocking_saves_s
            else None,
            "runs_started": len(self.runs),
            "runs_finished": sum(1 for r in self.runs if r.finished),
            "runs_model_equal": sum(1 for r in self.runs if r.model_matches),
            "longest_stall": max((r.longest_stall for r in self.runs), default=0),
            "runs": [asdict(run) for run in self.runs],
            "per_preemption": [asdict(p) for p in self.preemptions],
        }


def committed_step(peek: Peek) -> int:
    """The step a stored checkpoint holds, -1 for none or an unreadable one."""
    return peek.step if peek.status == "ok" and peek.step is not None else -1
