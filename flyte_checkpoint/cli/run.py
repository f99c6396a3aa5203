"""``run``: one task attempt with its checkpoint locations (a container entry point)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback

from flyte_checkpoint.cli.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, EXIT_TASK_FAILED
from flyte_checkpoint.cli.parser import storage_options_of, transfer_settings_of
from flyte_checkpoint.cli.reporting import report_error
from flyte_checkpoint.errors import Preempted, UnsupportedURIError


def run_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.context import CheckpointPaths
    from flyte_checkpoint.runners.attempt import load_and_run_task, resolve_task
    from flyte_checkpoint.uris import check_object_uri, clean_uri

    if clean_uri(args.checkpoint_path) is None:
        raise UnsupportedURIError(
            "--checkpoint-path is empty; give the path or URI this attempt saves its checkpoint to "
            "(an empty --prev-checkpoint means no previous attempt)"
        )
    paths = CheckpointPaths(checkpoint_path=args.checkpoint_path, prev_checkpoint_path=args.prev_checkpoint)
    for location in (args.checkpoint_path, args.prev_checkpoint):
        cleaned = clean_uri(location)
        if cleaned is not None:
            check_object_uri(cleaned)  # before the task starts, not when it first saves
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a task module in the current directory
    task = resolve_task(args.task)  # a reference that does not import is a configuration mistake
    try:
        result = load_and_run_task(
            task,
            checkpoint_paths=paths,
            inputs=args.inputs,
            run_name=args.run_name,
            action_name=args.action_name,
            storage_options=storage_options_of(args),
            transfer=transfer_settings_of(args),
            grace_seconds=args.grace_seconds,
        )
    except Preempted as preempted:
        _ignore_further_notices(preempted)
        if args.debug:
            traceback.print_exc()
        code = _preempted_exit_code(preempted)
        report_error(args, preempted, code, kind="preempted")
        return code
    except Exception as failure:  # the task's own error: reported as the task's, exit 1
        if args.debug:
            traceback.print_exc()
        report_error(args, failure, EXIT_TASK_FAILED, kind="task_failed")
        return EXIT_TASK_FAILED
    except KeyboardInterrupt as interrupt:  # Ctrl-C: say whether (and when) the checkpoint committed
        if args.debug:
            traceback.print_exc()
        notes = [note.removeprefix("flyte_checkpoint: ") for note in getattr(interrupt, "__notes__", [])]
        print(f"flyte-checkpoint: {'; '.join(notes) or 'interrupted'} (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(json.dumps(result, default=str))
    return EXIT_OK


def _ignore_further_notices(preempted: Preempted) -> None:
    """The attempt's outcome is decided: a later SIGTERM (the kubelet's after a cloud notice, a
    wrapper forwarding one again) must not kill the exiting process with 143 in place of 75.

    The handler was uninstalled when the attempt ended, so the signal's default action is back;
    the SIGKILL at the deadline still ends an exit that takes too long.
    """
    for signum in {signal.SIGTERM, preempted.signal}:
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)


def _preempted_exit_code(preempted: Preempted) -> int:
    if preempted.saved:
        return EXIT_PREEMPTED
    return preempted.code if isinstance(preempted.code, int) else EXIT_TASK_FAILED
