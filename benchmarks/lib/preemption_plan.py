"""What the preemption benchmark runs: scales, scenarios, grace periods and configurations."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
"""``benchmarks/``: the scripts and the trainer."""
PEEK_BYTES = 64 * 1024
START_TIMEOUT_S = 120.0
MIN_PREEMPTIONS = 50
"""The targets' "at least 50 preemptions per configuration"."""
STALL_LIMIT = 15
"""A run whose attempts resume no later than the one before this many times in a row is given
up as a preemption loop that never progresses."""
CALIBRATION_GRACE_S = 120.0
"""The grace period of the calibration run: long enough that no final save is cut short."""
CALIBRATION_ROUNDS = 5
"""Calibration runs at most, to collect ``--calibration-saves`` blocking final saves."""
TARGET_GRACE = 2.0
"""The targets' "G at least twice the save's duration": checked at every factor from this one up."""

VARIANTS = ("oneline", "nochange", "reference")
LABELS = {
    "oneline": "ours, one-line change",
    "nochange": "ours, no code change",
    "reference": "reference flyte 2.12.1",
}
BAD_VERDICTS = ("corrupt", "mixed", "unreadable")


@dataclass(frozen=True)
class Scale:
    """The job on one storage: step time, save interval, state size, run length, SIGTERM delays."""

    step_s: float
    every: int
    extra_mib: float
    run_steps: int
    delay_s: tuple[float, float]
    """SIGTERM this long after the attempt resumed training: uniform between the two."""
    call_s: tuple[float, float] = (0.0, 0.0)
    """``long-c-call``: each step's C call holds the GIL this long, uniform between the two."""

    @property
    def longest_step_s(self) -> float:
        """The step under way when a notice comes, at its longest (a long C call included)."""
        return self.step_s + self.call_s[1]


SCALES = {
    # A state large enough that a save (about half a second here) and G stand well above the
    # scheduler's noise; at 16 MiB a save took 50 ms and G was 0.1 s, decided by a step's instant.
    # SIGTERM up to three save intervals (1 s) after the resume, as the S3 scale has it.
    "local": Scale(step_s=0.1, every=10, extra_mib=192, run_steps=100, delay_s=(0.3, 3.0)),
    "s3": Scale(step_s=0.05, every=20, extra_mib=4, run_steps=120, delay_s=(0.3, 2.5)),
}
QUICK_SCALES = {
    "local": Scale(step_s=0.01, every=5, extra_mib=1, run_steps=30, delay_s=(0.05, 0.3)),
    "s3": Scale(step_s=0.02, every=5, extra_mib=1, run_steps=30, delay_s=(0.1, 0.6)),
}


@dataclass(frozen=True)
class Scenario:
    """A case an outside harness broke (issue 29), run as configurations of the one-line job."""

    name: str
    situation: str
    """Where its SIGTERM is meant to land, as the report says it."""
    scales: dict[str, Scale]
    """Per storage it runs on, its full scale."""
    quick: dict[str, Scale]
    timing: str = "training"
    """When the SIGTERM comes: ``training`` (a random instant after the resume), ``startup``
    (every other attempt: a random instant of its start-up and load), ``background`` (while a
    background save is uploading)."""
    group: bool = False
    """The job leads a process group with its fork children, and the SIGKILL at G goes to the
    whole group, as the kubelet's does to a container; the SIGTERM goes to the job alone, as the
    kubelet's goes to the container's PID 1 (see :attr:`sigterm_to_group`)."""
    sigterm_to_group: bool = False
    """The SIGTERM goes to the whole group too (Slurm's ``scancel``, ``tini -g``): a DataLoader's
    workers then die with it, and torch fails the step in progress with ``RuntimeError`` (no
    library can save that step; benchmarks/README.md, "fork children")."""


_LOCAL_64 = Scale(step_s=0.1, every=10, extra_mib=64, run_steps=60, delay_s=(0.3, 3.0))
_S3_SHORT = replace(SCALES["s3"], run_steps=60)
_QUICK_LOCAL = Scale(step_s=0.01, every=5, extra_mib=1, run_steps=20, delay_s=(0.05, 0.3))
_QUICK_S3 = replace(QUICK_SCALES["s3"], run_steps=20)
SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            # 24 MiB: three 8 MiB parts, a multipart upload (the deadlock of issue 29 was a
            # background save whose writer was done, committing, with its last parts waiting);
            # a save every 2 s, each upload taking about that long.
            "s3-background-then-notice",
            "a background save uploading",
            {"s3": replace(SCALES["s3"], every=40, extra_mib=24, run_steps=200)},
            {"s3": replace(QUICK_SCALES["s3"], every=10, extra_mib=24, run_steps=40)},
            timing="background",
        ),
        Scenario(
            # Saves every 3 (5) steps, each slower than that: the files are rewritten in place
            # under every background save.
            "in-place",
            "a background save in flight over files rewritten in place",
            {
                "local": replace(_LOCAL_64, every=3),
                "s3": replace(_S3_SHORT, every=5),
            },
            {"local": replace(_QUICK_LOCAL, every=2), "s3": replace(_QUICK_S3, every=2)},
        ),
        Scenario(
            "fork-children",
            "two DataLoader fork workers alive",
            {"local": _LOCAL_64, "s3": _S3_SHORT},
            {"local": _QUICK_LOCAL, "s3": _QUICK_S3},
            group=True,
        ),
        Scenario(
            "long-c-call",
            "a C call holding the GIL",
            {
                "local": Scale(
                    step_s=0.05, every=3, extra_mib=64, run_steps=15, delay_s=(0.3, 3.0), call_s=(0.3, 1.0)
                ),
                "s3": Scale(
                    step_s=0.05, every=3, extra_mib=4, run_steps=15, delay_s=(0.3, 3.0), call_s=(0.3, 1.0)
                ),
            },
            {
                "local": Scale(
                    step_s=0.01, every=2, extra_mib=1, run_steps=6, delay_s=(0.1, 0.6), call_s=(0.2, 0.4)
                ),
                "s3": Scale(
                    step_s=0.02, every=2, extra_mib=1, run_steps=6, delay_s=(0.1, 0.6), call_s=(0.2, 0.4)
                ),
            },
        ),
        Scenario(
            "startup-load",
            "start-up or the checkpoint load",
            {"local": _LOCAL_64, "s3": _S3_SHORT},
            {"local": _QUICK_LOCAL, "s3": _QUICK_S3},
            timing="startup",
        ),
    )
}
PLAIN = "plain"
HANG_PROBE_S = 10.0
"""A scenario's attempt still running at G is given this much longer (or 3 G) before the SIGKILL:
one that has not ended by then is a hang (the S3 deadlock of issue 29 hung until SIGKILL)."""


@dataclass(frozen=True)
class Grace:
    """A grace period as a multiple of the save's duration, optionally counted after the margin."""

    factor: float
    after_margin: bool = False
    """G is then the shortest period whose part before the notice's margin is ``factor`` saves
    plus one step (the step under way when the SIGTERM comes): twice the save, to save in."""

    @property
    def label(self) -> str:
        return f"{self.factor:g}x" + ("+margin" if self.after_margin else "")

    def seconds(self, save_s: float, step_s: float) -> float:
        if not self.after_margin:
            return round(self.factor * save_s, 3)
        from flyte_checkpoint.preemption.notice import safety_margin

        wanted = self.factor * save_s + step_s
        low, high = wanted, 2 * wanted + 1.0  # the margin is at most half of G
        while high - low > 1e-4:
            middle = (low + high) / 2
            low, high = (low, middle) if middle - safety_margin(middle) >= wanted else (middle, high)
        return round(high, 3)

    @classmethod
    def parse(cls, text: str) -> Grace:
        number, plus, rest = text.strip().removesuffix("x").partition("+")
        if plus and rest.strip().removeprefix("x") != "margin":
            raise ValueError(text)
        return cls(float(number.removesuffix("x")), after_margin=bool(plus))


@dataclass(frozen=True)
class Config:
    storage: str
    variant: str
    grace_label: str
    grace_factor: float
    grace_s: float
    save_s: float
    scenario: str = PLAIN

    @property
    def margin_s(self) -> float:
        """What ``flyte_checkpoint`` keeps free of G for the process to exit (its save deadline)."""
        from flyte_checkpoint.preemption.notice import safety_margin

        return safety_margin(self.grace_s)

    @property
    def name(self) -> str:
        kind = self.variant if self.scenario == PLAIN else self.scenario
        return f"{self.storage}/{kind}/G={self.grace_label}"

    @property
    def key(self) -> str:
        return self.name.replace("/", "-").replace("=", "").replace("+", "-plus-")
