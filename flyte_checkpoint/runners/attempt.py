"""Running one task attempt inside its :class:`TaskContext`, as a platform's container entry does.

Every runner installs the preemption handler around its attempts (:mod:`flyte_checkpoint.preemption`):
a ``Preempted`` leaving an attempt is a preemption, which :func:`load_and_run_task` (one attempt)
lets propagate and the local runners retry on their own budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from flyte_checkpoint.context import CheckpointPaths, TaskContext, attempt_number_from_env, task_context
from flyte_checkpoint.errors import ConfigurationError, Preempted, add_context
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.preemption.handler import ending_delivered_to, install_preemption_handler
from flyte_checkpoint.single.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint
from flyte_checkpoint.storage.options import TransferSettings

logger = logging.getLogger("flyte_checkpoint")

TaskFunction = Callable[..., Any]
T = TypeVar("T")


def resolve_task(reference: str | TaskFunction) -> TaskFunction:
    """The function named by ``"package.module:function"`` (or the callable itself)."""
    if callable(reference):
        return reference
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"task reference {reference!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import module {module_name!r} for task {reference!r}: {exc}; check the "
            "name and that it is importable (PYTHONPATH)"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise ConfigurationError(f"task reference {reference!r} is not callable")
    return target  # type: ignore[no-any-return]


def _close_helper(context: TaskContext, leaving: BaseException | None = None) -> None:
    """Close the checkpoint helper the attempt built, if it asked for one (never builds one).

    When the attempt is ``leaving`` by an exception (its own error, a preemption), a failure
    to close (a background save that failed, or did not commit by the save deadline) is attached
    to it, never raised instead of it.
    """
    helper = context.data.get(CHECKPOINT_CACHE_KEY)
    if not isinstance(helper, Checkpoint):
        return
    if leaving is None:
        helper.close()
    else:
        helper.__exit__(type(leaving), leaving, leaving.__traceback__)


@contextlib.contextmanager
def _saves_accounted(context: TaskContext) -> Iterator[None]:
    """A ``Preempted`` leaving the block that does not know whether a save committed after the
    notice (the handler ended a task that did not handle it) is replaced by the account of the
    attempt's helper, which does; any other exception leaving it after a notice becomes such a
    ``Preempted`` too. Wrapped around the closing of the helper, so that a background save that
    committed meanwhile counts."""
    try:
        yield
    except Preempted as preempted:
        helper = context.data.get(CHECKPOINT_CACHE_KEY)
        nothing_to_add = preempted.saved is not None or notice.current_notice() is None
        if nothing_to_add or not isinstance(helper, Checkpoint):
            raise
        raise helper.preemption() from preempted
    except Exception as failure:
        # Counted as a preemption, never against the user's retries; the failure is the cause.
        if notice.current_notice() is None:
            raise
        helper = context.data.get(CHECKPOINT_CACHE_KEY)
        account = helper.preemption() if isinstance(helper, Checkpoint) else None
        ending = notice.preemption_of(failure, account)
        if ending is None:  # pragma: no cover - the notice is never withdrawn within an attempt
            raise
        raise ending from failure


def _say_what_committed(context: TaskContext, interrupt: KeyboardInterrupt) -> None:
    """Note on a Ctrl-C that ended the attempt whether its checkpoint committed: the user deciding
    what to do next wants to know what a retry would resume from (saves in flight have finished)."""
    helper = context.data.get(CHECKPOINT_CACHE_KEY)
    if not isinstance(helper, Checkpoint):
        return
    committed = helper.last_committed
    if committed is None:
        said = (
            f"interrupted before any save of this attempt committed to {helper.remote_destination}; "
            "what is there, if anything, is from before this attempt"
        )
    else:
        said = (
            f"interrupted after the checkpoint saved at {committed:%Y-%m-%d %H:%M:%S} UTC committed "
            f"to {helper.remote_destination}; an attempt that restores from there resumes from it"
        )
    add_context(interrupt, f"flyte_checkpoint: {said}")


@contextlib.contextmanager
def attempt_scope(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` current for one attempt and close its checkpoint helper afterwards.

    A ``Preempted`` leaving the attempt says whether a save committed after the notice; a
    ``KeyboardInterrupt`` says in a note whether (and when) the attempt's checkpoint committed.
    """
    with _saves_accounted(context):
        try:
            with notice.task_code_running(), task_context(context):
                yield context
        except BaseException as leaving:
            _close_helper(context, leaving)
            if isinstance(leaving, KeyboardInterrupt):
                _say_what_committed(context, leaving)
            raise
        _close_helper(context)


@contextlib.asynccontextmanager
async def attempt_scope_async(context: TaskContext) -> AsyncIterator[TaskContext]:
    """:func:`attempt_scope` for async runners: the helper is closed in a worker thread.

    Closing waits for a background save to finish uploading and removes the workspace, which
    may take as long as the save itself; the event loop keeps serving other tasks meanwhile.
    """
    with _saves_accounted(context):
        try:
            with notice.task_code_running(), task_context(context):
                yield context
        except BaseException as leaving:
            await asyncio.to_thread(_close_helper, context, leaving)
            if isinstance(leaving, KeyboardInterrupt):
                _say_what_committed(context, leaving)
            raise
        await asyncio.to_thread(_close_helper, context)


def call_task(fn: TaskFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call a ``def`` or ``async def`` task function from synchronous code."""
    if inspect.iscoroutinefunction(fn):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(fn(*args, **kwargs))
        raise RuntimeError(
            f"{fn.__qualname__} is async and an event loop is already running in this thread; "
            "await the async runner (run_with_retries_async) instead"
        )
    return fn(*args, **kwargs)


async def acall_task(fn: TaskFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call a ``def`` (in a worker thread) or ``async def`` task function from async code.

    An ``async def`` task that does not handle a preemption notice is ended as
    :func:`ended_on_preemption` says. A ``def`` task in its worker thread cannot be ended from
    outside: it runs on until it returns, stops on the notice itself, or the SIGKILL comes.
    """
    if inspect.iscoroutinefunction(fn):
        return await ended_on_preemption(fn(*args, **kwargs))
    with ending_delivered_to(_cannot_end_a_thread):
        return await asyncio.to_thread(fn, *args, **kwargs)


def _cannot_end_a_thread(ending: Preempted) -> None:
    logger.warning(
        "%s; the task is a def function running in a worker thread, which cannot be ended from "
        "outside, so it runs on until it returns or is killed: read checkpoint.preempted in its "
        "loop to save and stop in time",
        ending,
    )


async def ended_on_preemption(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` in the current task; end it with ``Preempted`` if the task does not
    handle a preemption notice.

    In an event loop the preemption handler cannot raise ``Preempted`` in the main thread (it
    would escape the loop, past the caller): once the saves in flight have committed, the current
    asyncio task is cancelled instead, the ``CancelledError`` unwinds the task's code from the
    ``await`` it is in, and this raises the ``Preempted`` in its place. A cancellation that arrives
    after ``awaitable`` finished is never delivered.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None, "ended_on_preemption runs inside an asyncio task"
    endings: list[Preempted] = []
    waiting = True

    def cancel_if_waiting() -> None:  # in the loop's thread, like the ``finally`` below: no race
        if waiting:
            current.cancel()

    def deliver(ending: Preempted) -> None:  # in the watcher's thread
        endings.append(ending)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to end
            loop.call_soon_threadsafe(cancel_if_waiting)

    with ending_delivered_to(deliver):
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not endings:
                raise
            if hasattr(current, "uncancel"):  # Python 3.11+: the cancellation was ours, not a caller's
                current.uncancel()
            raise endings[0] from None
        finally:
            waiting = False


def load_and_run_task(
    task: str | TaskFunction,
    *,
    checkpoint_paths: CheckpointPaths | None,
    inputs: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    action_name: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    attempt_number: int | None = None,
    grace_seconds: float | None = None,
) -> Any:
    """Run ``task`` once with ``inputs`` as keyword arguments, inside a fresh :class:`TaskContext`.

    This is what a platform's container entry does for one attempt: the checkpoint locations come
    from ``checkpoint_paths``, the attempt number from ``attempt_number`` or, when that is
    ``None``, from ``FLYTE_ATTEMPT_NUMBER`` (read once, into the context; 0 when unset).

    The preemption handler is installed for the attempt (from the main thread; elsewhere nothing
    is installed) and the previous signal handlers are restored when it ends. ``grace_seconds``
    is the time from SIGTERM to the expected SIGKILL; ``None`` reads
    ``FLYTE_CHECKPOINT_GRACE_SECONDS`` (30 s when unset). An attempt ended by a preemption notice
    raises :class:`~flyte_checkpoint.errors.Preempted`, which is left to the caller: this runs one
    attempt, and retrying is the platform's decision.
    """
    with install_preemption_handler(grace_seconds=grace_seconds):
        fn = resolve_task(task)
        context = TaskContext(
            checkpoint_paths=checkpoint_paths,
            run_name=run_name,
            action_name=action_name,
            storage_options=storage_options,
            transfer=transfer,
            attempt_number=attempt_number_from_env() if attempt_number is None else attempt_number,
        )
        with attempt_scope(context):
            return call_task(fn, (), dict(inputs or {}))
