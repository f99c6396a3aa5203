"""The preemption benchmark's supervisor: runs a configuration's attempts, each preempted."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks import _preemption_trainer as trainer  # stdlib-only at module level
from benchmarks.lib.attempts import HarnessError, Processes, tail, wait_for_event
from benchmarks.lib.preemption_plan import (
    HANG_PROBE_S,
    SCENARIOS,
    STALL_LIMIT,
    START_TIMEOUT_S,
    Config,
    Scale,
)
from benchmarks.lib.preemption_results import (
    AttemptRecord,
    ConfigResult,
    Peek,
    Preemption,
    RunResult,
    committed_step,
)
from benchmarks.lib.preemption_stores import Store
from benchmarks.lib.processes import group_members, wait_until
from benchmarks.lib.report import log


class Supervisor:
    """Runs one configuration: runs of attempts, each preempted, until enough preemptions."""

    def __init__(
        self,
        config: Config,
        scale: Scale,
        store: Store,
        processes: Processes,
        work: Path,
        preemptions: int,
        baseline_digest: str,
        seed: int,
    ) -> None:
        self.config = config
        self.scale = scale
        self.store = store
        self.processes = processes
        self.work = work / config.key
        self.wanted = preemptions
        self.cap = 2 * preemptions
        """Preemptions after which an unfinished last run is given up, progressing or not."""
        self.baseline_digest = baseline_digest
        self.rng = random.Random(f"{seed}/{config.name}")
        self.result = ConfigResult(config)
        self.scenario = SCENARIOS.get(config.scenario)
        self.startup_s = 0.0
        """The longest start-up and load seen (from starting the process to its resume)."""
        self.call_rate = trainer.call_rate() if scale.call_s[1] else 0.0

    def run(self) -> ConfigResult:
        started = time.monotonic()
        try:
            while len(self.result.preemptions) < self.wanted:
                self.result.runs.append(self._run(len(self.result.runs)))
        except Exception as exc:  # reported with the figures so far; the other configurations go on
            self.result.error = f"{type(exc).__name__}: {exc}"
            log(f"{self.config.name}: FAILED: {self.result.error}")
        self.result.wall_s = time.monotonic() - started
        return self.result

    def _run(self, index: int) -> RunResult:
        prefix = f"{self.config.key}/run-{index}"
        dest, prev = f"{prefix}/checkpoint", f"{prefix}/prev_checkpoint"
        prev_uri = self.store.uri(prev)
        started = time.monotonic()
        attempts: list[AttemptRecord] = []
        pending: list[AttemptRecord] = []
        """Preempted attempts waiting for an attempt that resumes (one preempted during its
        start-up says nothing of what it would have loaded)."""
        stall = longest = 0
        while True:
            number = len(attempts)
            staged = None
            if number:
                if attempts[-1].preemption is not None:
                    time.sleep(self.store.settle_s)  # a kubelet restarts a pod seconds later
                staged = self.store.peek(prev) if self.store.stage(dest, prev) else Peek("none")
            give_up = len(self.result.preemptions) >= self.cap or stall >= STALL_LIMIT
            record = self._attempt(index, number, dest, prev_uri if number else None, staged, give_up)
            if attempts:
                previous = attempts[-1]
                if record.first("resumed") is not None:
                    for killed in pending:
                        self._complete(killed, record)
                    pending.clear()
                stall = stall + 1 if record.resumed_step <= previous.resumed_step else 0
                longest = max(longest, stall)
            if record.preemption is not None:
                pending.append(record)
            attempts.append(record)
            if record.finished or give_up:
                break
        done = attempts[-1].first("done")
        digest = None if done is None else done["model_digest"]
        log(
            f"{self.config.name}: run {index} {'finished' if attempts[-1].finished else 'GAVE UP'} after "
            f"{len(attempts)} attempt(s); {len(self.result.preemptions)} preemption(s) so far"
        )
        return RunResult(
            index=index,
            attempts=len(attempts),
            finished=attempts[-1].finished,
            final_step=attempts[-1].last_step(),
            model_matches=None if digest is None else digest == self.baseline_digest,
            wall_s=time.monotonic() - started,
            longest_stall=longest,
        )

    def _attempt(
        self, run: int, number: int, dest: str, src: str | None, staged: Peek | None, give_up: bool
    ) -> AttemptRecord:
        """Start attempt ``number``, preempt it at a random instant, and record what it did.

        With ``give_up`` (the run made no progress for too long) it is killed once it resumed:
        only its resume was wanted, to complete the previous attempt's preemption.
        """
        config, scale = self.config, self.scale
        spec = self.processes.spec(
            self.work / f"run-{run}" / f"attempt-{number}",
            variant=config.variant,
            scenario=config.scenario,
            dest=self.store.uri(dest),
            src=src,
            storage_options=self.store.storage_options,
            env={**self.store.env, "FLYTE_CHECKPOINT_GRACE_SECONDS": repr(config.grace_s)},
            every=scale.every,
            step_s=scale.step_s,
            extra_mib=scale.extra_mib,
            total_steps=scale.run_steps,
            call_s=scale.call_s,
            call_rate=self.call_rate,
        )
        events_path = Path(spec["events"])
        spawned = time.monotonic()
        group = self.scenario is not None and self.scenario.group
        process = self.processes.start(trainer.attempt, spec, daemon=not group)
        preemption: Preemption | None = None
        at_startup = (
            self.scenario is not None
            and self.scenario.timing == "startup"
            and number % 2 == 1
            and not give_up
        )
        try:
            if at_startup:
                # Every other attempt: SIGTERM at a random instant of its start-up and load.
                delay = self.rng.uniform(0.0, self.startup_s)
                if not multiprocessing.connection.wait([process.sentinel], delay):
                    preemption = self._preempt(process, events_path, dest, run, number, delay)
            else:
                preemption = self._preempt_in_training(process, spec, events_path, dest, run, number, give_up)
            process.join()
        finally:
            self.processes.reap(process)
            # The state and the restored copy are the bulk (a few hundred MiB an attempt, tens of
            # GB a run); the event log and the output, all the figures come from, stay.
            for bulk in (spec["state_dir"], spec["tmp"]):
                shutil.rmtree(bulk, ignore_errors=True)
        events = trainer.read_events(events_path)
        record = AttemptRecord(
            number, spawned, events, time.monotonic(), process.exitcode, staged, preemption
        )
        if record.first("resumed") is not None:
            self.startup_s = max(self.startup_s, record.resumed["t"] - spawned)
        if preemption is not None and record.finished:
            # It reached the final step in the instant between the wait and the SIGTERM.
            self.result.preemptions.remove(preemption)
            record.preemption = preemption = None
        if preemption is not None:
            preemption.at_exit = self.store.peek(dest)
            preemption.steps_done = record.last_step()
            exception = record.first("exception")
            preemption.exception = None if exception is None else exception["kind"]
            if self.scenario is not None:
                preemption.situation = self._in_situation(preemption, events)
            if config.variant == "oneline":
                self.result.blocking_saves_s.extend(_blocking_saves(events))
        elif not record.finished and not give_up:
            # The job died by itself (in a scenario: the task the issue says must not die).
            exception = record.first("exception")
            raised = "" if exception is None else f"{exception['kind']}: {exception['message']}; "
            raise HarnessError(
                f"{config.name} attempt {number} ended without a preemption (exit {process.exitcode}): "
                f"{raised}{tail(spec['stderr'])}"
            )
        return record

    def _preempt_in_training(
        self,
        process: Any,
        spec: dict[str, Any],
        events_path: Path,
        dest: str,
        run: int,
        number: int,
        give_up: bool,
    ) -> Preemption | None:
        """Wait for the attempt to resume training, then SIGTERM it at a random instant (with
        ``background`` timing: the first background save handed over after that instant)."""
        config, scale = self.config, self.scale
        events = wait_for_event(process, events_path, "resumed", START_TIMEOUT_S)
        if events is None:
            raise HarnessError(
                f"{config.name} attempt {number} never resumed (exit {process.exitcode}): "
                f"{tail(spec['stderr'])}"
            )
        resumed_at = next(e["t"] for e in events if e["e"] == "resumed")
        if give_up:
            process.kill()  # only its resume was wanted: the run is not progressing
            return None
        delay = self.rng.uniform(*scale.delay_s)
        left = resumed_at + delay - time.monotonic()
        if multiprocessing.connection.wait([process.sentinel], max(0.0, left)):
            return None
        if self.scenario is not None and self.scenario.timing == "background":
            seen = len(trainer.read_events(events_path))
            handed = wait_for_event(
                process,
                events_path,
                "saved",
                3 * scale.every * scale.step_s + 5.0,
                after=seen,
                test=lambda event: bool(event["background"]),
            )
            if handed is None and not process.is_alive():
                return None
            # Anywhere in the upload (about 1-3 s at this scale), its end included: the writer
            # done and the last parts still on their way is the case that deadlocked.
            time.sleep(self.rng.uniform(0.0, 1.5))
            delay = time.monotonic() - resumed_at
        return self._preempt(process, events_path, dest, run, number, delay)

    def _signal(self, process: Any, signum: int) -> None:
        """``signum`` to the job, or to its whole process group (a scenario with fork children:
        the SIGKILL always, the SIGTERM as :attr:`Scenario.sigterm_to_group` says)."""
        scenario = self.scenario
        to_group = (
            scenario is not None
            and scenario.group
            and (signum != signal.SIGTERM or scenario.sigterm_to_group)
        )
        with contextlib.suppress(ProcessLookupError):
            if to_group:
                os.killpg(process.pid, signum)
            else:
                os.kill(process.pid, signum)

    def _preempt(
        self, process: Any, events_path: Path, dest: str, run: int, number: int, delay: float
    ) -> Preemption | None:
        """SIGTERM now; SIGKILL once the grace period is over, unless the process has ended.

        ``None`` if the process ended (reached the final step) before the SIGTERM could be sent.
        A scenario's attempt (with its group's processes) still running at G is counted as a
        SIGKILL, then given ``HANG_PROBE_S`` more before the SIGKILL, to tell a hang apart.
        """
        before = trainer.read_events(events_path)
        at_sigterm = self.store.peek(dest)
        sent = time.monotonic()
        if not process.is_alive():
            return None
        self._signal(process, signal.SIGTERM)
        grace = self.config.grace_s
        group = self.scenario is not None and self.scenario.group

        def group_gone() -> bool:
            return not group or not group_members(process.pid)

        in_time = ended = bool(multiprocessing.connection.wait([process.sentinel], grace))
        exit_after = time.monotonic() - sent  # when it ended by itself, or the SIGKILL's instant
        children_left = len(group_members(process.pid)) if ended and group else 0
        children_late = ended and not wait_until(group_gone, sent + grace)
        late = not ended or children_late
        hang = False
        if late and self.scenario is not None:
            probe_end = time.monotonic() + max(HANG_PROBE_S, 3 * grace)
            ended = bool(multiprocessing.connection.wait([process.sentinel], max(HANG_PROBE_S, 3 * grace)))
            hang = not (ended and wait_until(group_gone, probe_end))
            if ended and not in_time:
                exit_after = time.monotonic() - sent
        if late and (not ended or hang):
            self._signal(process, signal.SIGKILL)
        process.join()
        handed = [
            event["step"]
            for event in before
            if (event["e"] == "saved" and event["background"])
            or (event["e"] == "submit" and not event["background"])
        ]
        begun = [event["step"] for event in before if event["e"] == "save"]
        submitted = [event["step"] for event in before if event["e"] == "submit"]
        in_flight = handed[-1] if handed and handed[-1] > committed_step(at_sigterm) else None
        preparing = begun[-1] if begun and begun[-1] > max(handed, default=-1) else None
        exit_text = "SIGKILL" if not ended else f"exit {process.exitcode}"
        preemption = Preemption(
            config=self.config.name,
            run=run,
            attempt=number,
            delay_s=delay,
            at_sigterm=at_sigterm,
            in_flight=in_flight,
            preparing=preparing,
            steps_done=0,
            exit=exit_text
            + (" after G" if ended and not in_time else "")
            + ("; its children past G" if children_late else ""),
            exit_code=process.exitcode,
            exit_after_s=exit_after,
            exception=None,
            called=submitted[-1] if submitted and submitted[-1] > committed_step(at_sigterm) else None,
            late=late,
            hang=hang,
            children_left=children_left,
            sent_at=sent,
        )
        self.result.preemptions.append(preemption)
        return preemption

    def _in_situation(self, preemption: Preemption, events: list[dict[str, Any]]) -> bool:
        """Whether the scenario's SIGTERM landed where it was meant to (read from the events)."""
        assert self.scenario is not None
        before = [event for event in events if event["t"] < preemption.sent_at]
        name = self.scenario.name
        if name == "startup-load":
            return not any(event["e"] == "resumed" for event in before)
        if name == "long-c-call":
            calls = [event for event in before if event["e"] == "call"]
            return bool(calls) and not any(
                event["e"] == "called" and event["step"] == calls[-1]["step"] for event in before
            )
        if name == "fork-children":
            return any(event["e"] == "children" for event in before)
        # s3-background-then-notice, in-place: a background save handed over, not yet stored.
        background = {event["step"] for event in before if event["e"] == "saved" and event["background"]}
        return preemption.in_flight is not None and preemption.in_flight in background

    def _complete(self, killed: AttemptRecord, following: AttemptRecord) -> None:
        """Fill in the preemption of ``killed`` from how ``following`` resumed."""
        preemption = killed.preemption
        if preemption is None:
            return
        resumed = following.resumed
        preemption.resumed = resumed["step"]
        if preemption.called is not None:
            preemption.called_kept = resumed["verdict"] == "ok" and resumed["step"] >= preemption.called
        preemption.verdict = resumed["verdict"]
        preemption.detail = resumed.get("detail", "")
        staged = following.staged
        at_exit = preemption.at_exit
        preemption.late_commit = (
            staged is not None and at_exit is not None and committed_step(staged) != committed_step(at_exit)
        )
        if preemption.verdict == "none" and staged is not None and staged.status != "none":
            preemption.verdict = "unreadable"
            preemption.detail = "a checkpoint was staged, and the helper loaded none"
        elif preemption.verdict == "ok" and staged is not None and staged.step != preemption.resumed:
            preemption.verdict = "mixed"
            preemption.detail = (
                f"the staged checkpoint holds step {staged.step}, the restored {preemption.resumed}"
            )
        ok = preemption.verdict == "ok"
        at = preemption.at_sigterm
        committed = committed_step(at)
        # Never below 0: an attempt preempted in its start-up, between the two, may have saved.
        preemption.steps_lost = max(0, preemption.steps_done - preemption.resumed)
        preemption.committed_in_grace = ok and preemption.resumed > committed
        preemption.previous_survived = (ok and preemption.resumed >= committed) or (
            preemption.verdict == "none" and at.status == "none"
        )
        preemption.restart_s = resumed["t"] - following.spawned
        started = killed.first("resumed")
        started_at = killed.ended if started is None else started["t"]
        kept_at = killed.step_done_at(preemption.resumed) or started_at
        earlier = max(0, killed.resumed_step - preemption.resumed)  # work of earlier attempts lost too
        preemption.wasted_s = (
            (killed.ended - kept_at)
            + earlier * killed.seconds_per_step(self.scale.step_s)
            + preemption.restart_s
        )


def _blocking_saves(events: list[dict[str, Any]]) -> list[float]:
    """Durations of the blocking saves (ours': made after a notice) that returned."""
    begun: dict[int, float] = {}
    durations = []
    for event in events:
        if event["e"] == "save" and not event["background"]:
            begun[event["step"]] = event["t"]
        elif event["e"] == "saved" and not event["background"] and event["step"] in begun:
            durations.append(event["t"] - begun[event["step"]])
    return durations
