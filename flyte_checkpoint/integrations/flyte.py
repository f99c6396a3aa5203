"""Flyte SDK plugin: inside a Flyte task, ``flyte.ctx().checkpoint`` is a ``flyte_checkpoint.Checkpoint``.

Install the extra (``pip install '.[flyte]'``) and add one line to the module that
defines your tasks, so it runs wherever that module is imported (your machine and the task's
container alike)::

    import flyte
    import flyte_checkpoint.integrations.flyte

    flyte_checkpoint.integrations.flyte.install()

    env = flyte.TaskEnvironment(name="train")

    @env.task(retries=3)
    def train(n: int) -> int:
        checkpoint = flyte_checkpoint.integrations.flyte.checkpoint()  # typed as ours
        restored = checkpoint.load_sync()
        ...

What :func:`install` does:

- It registers a context provider (:func:`flyte_checkpoint.context.register_context_provider`),
  so :func:`flyte_checkpoint.ctx` sees the running Flyte task when no ``flyte_checkpoint``
  context of its own is set, with the task's checkpoint paths, run and action names and attempt
  number. Task code written against ``flyte_checkpoint.ctx()`` runs unchanged under Flyte.
- It replaces the SDK's ``flyte.models.TaskContext.checkpoint`` property (or adds it, on an SDK
  without one) with one that returns the same helper as ``flyte_checkpoint.ctx().checkpoint``,
  cached in the SDK context's ``data`` under :data:`~flyte_checkpoint.CHECKPOINT_CACHE_KEY`, so
  every access in one task attempt returns the same helper, as the SDK's property does. The SDK
  has no hook for choosing the checkpoint class (its property builds a ``flyte.Checkpoint`` and
  asserts that the cached helper is one), so this public property of the public class is
  patched; :func:`uninstall` puts it back. Type checkers still see the SDK's class there:
  use :func:`checkpoint` (or ``flyte_checkpoint.ctx().checkpoint``) where the types matter, e.g.
  for ``save(..., background=True)``.
- It wraps ``execute`` of the SDK's function tasks (``flyte.extend.AsyncFunctionTaskTemplate``,
  which clustered tasks share) so that every task attempt runs with the preemption handler
  installed (:func:`flyte_checkpoint.preemption.install_preemption_handler`; SIGTERM becomes
  ``checkpoint.preempted``) and its previous signal handlers restored afterwards, and an attempt
  ended by a preemption notice (``raise checkpoint.preemption()``, or the handler ending a task
  that does not handle it) ends with ``flyte.errors.RuntimeSystemError`` code ``"Preempted"``:
  the container entry writes it to ``error.pb`` with the system error kind, so the platform
  retries the attempt on its system budget, not the user's ``retries``. The SDK has no hook
  around an attempt that runs where signal handlers can be set (its ``pre``/``post`` are methods
  of each task class, and a ``def`` task runs in a worker thread), hence the wrapper.
- It wraps the SDK's entries to a local run, ``flyte.run`` and the ``run`` of
  ``flyte.with_runcontext(...)`` (called, or awaited through ``.aio``): the SDK's local mode runs
  every attempt in a background event loop's thread, where no signal handler can be set, while
  the main thread waits in that call. So a local run started from the main thread has the
  preemption handler installed there for its length (the previous handlers restored after it),
  and the attempts find it: a SIGTERM is ``checkpoint.preempted``, the preempted attempt ends
  with the system error, which the SDK's local loop retries within the task's ``retries`` (each
  retry starts without the notice and resumes from the checkpoint the SDK stages). When no retry
  is left, the run raises :class:`~flyte_checkpoint.errors.Preempted` (a ``SystemExit``: the
  process ends with 143 after a SIGTERM, as remote attempts do) instead of the SDK's error.

All four are undone by :func:`uninstall`; calling :func:`install` or :func:`uninstall` twice is
harmless. The stored format is the
SDK's (one object: bytes or a file as-is, a directory as one ``.tar.gz``), so a checkpoint saved by
the SDK's own helper loads with ours and the other way round, and the SDK's local retries (which
copy ``checkpoint`` to ``prev_checkpoint`` before each retry) resume from what ours saved.

The attempt number: on a cluster it is the SDK's (``FLYTE_ATTEMPT_NUMBER``, set by the platform).
The SDK's local mode runs retries in this process without setting it (``flyte.ctx().attempt_number``
is 0 on every local attempt), so there each new attempt of an action that reaches this plugin
(through ``flyte_checkpoint.ctx()``, ``checkpoint()`` or ``flyte.ctx().checkpoint``) gets the next
number, counted per run and action: ``flyte_checkpoint.ctx().attempt_number`` is 0, 1, 2...

Supported SDK versions: :data:`SUPPORTED_FLYTE_VERSIONS` (the ``flyte`` extra pins them). Versions
before 2.1.3 carry no ``checkpoint_paths`` on the task context and are refused with a clear error.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.metadata
import logging
import re
import threading
import warnings
from collections.abc import Callable, Coroutine, Hashable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import flyte
import flyte._run
import flyte.errors
import flyte.extend
import flyte.models

from flyte_checkpoint.context import (
    CheckpointPaths,
    TaskContext,
    register_context_provider,
    unregister_context_provider,
)
from flyte_checkpoint.errors import ConfigurationError, Preempted, describe_error
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.preemption.handler import install_preemption_handler
from flyte_checkpoint.preemption.notice import check_grace_seconds
from flyte_checkpoint.runners.attempt import ended_on_preemption
from flyte_checkpoint.single.checkpoint import Checkpoint
from flyte_checkpoint.storage import TransferSettings, check_transfer_settings

__all__ = [
    "SUPPORTED_FLYTE_VERSIONS",
    "checkpoint",
    "install",
    "is_installed",
    "task_context_from_flyte",
    "uninstall",
]

logger = logging.getLogger("flyte_checkpoint")

SUPPORTED_FLYTE_VERSIONS = ">=2.1.3,<2.13"
"""The SDK versions this plugin is tested with; the ``flyte`` extra pins the same range."""

_FIRST_SUPPORTED = (2, 1, 3)
_FIRST_UNTESTED = (2, 13)
_PROPERTY_NAME = "checkpoint"
_EXECUTE_NAME = "execute"
_RUN_NAME = "run"
PREEMPTED_ERROR_CODE = "Preempted"
"""The code of the ``flyte.errors.RuntimeSystemError`` that ends a preempted task attempt."""

_Execute = Callable[..., Coroutine[Any, Any, Any]]


class _Missing:
    """Marks that the SDK's ``TaskContext`` had no ``checkpoint`` attribute of its own."""


_MISSING = _Missing()


@dataclasses.dataclass
class _Installation:
    """What :func:`install` changed, so :func:`uninstall` can put it back exactly."""

    sdk_class: type[Any]
    original_property: object
    our_property: property
    storage_options: Mapping[str, Any] | None
    transfer: TransferSettings | None
    grace_seconds: float | None
    task_class: type[Any]
    original_execute: _Execute
    our_execute: _Execute
    runner_class: type[Any]
    original_runner_run: object
    our_runner_run: object
    run_modules: tuple[ModuleType, ...]
    original_run: object
    our_run: object


_lock = threading.Lock()
_installation: _Installation | None = None


class _LocalAttempts:
    """Numbers the attempts the SDK's local mode runs in this process, per run and action.

    Local mode builds a fresh SDK task context (and ``data`` dict) for every attempt and sets no
    ``FLYTE_ATTEMPT_NUMBER``; the first time this plugin sees an attempt's context it gives it the
    next number of its action and records it in that context's ``data``.
    """

    DATA_KEY = "__flyte_checkpoint_attempt__"

    def __init__(self, remembered_actions: int = 4096) -> None:
        self._lock = threading.Lock()
        self._last: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self._remembered = remembered_actions

    def number_of(self, data: dict[str, Any], action: Hashable) -> int:
        with self._lock:
            number = data.get(self.DATA_KEY)
            if isinstance(number, int):
                return number
            number = self._last.get(action, -1) + 1
            self._last[action] = number
            self._last.move_to_end(action)
            while len(self._last) > self._remembered:  # a long-lived process runs many actions
                self._last.popitem(last=False)
            data[self.DATA_KEY] = number
            return number


_local_attempts = _LocalAttempts()


def task_context_from_flyte(
    sdk_context: flyte.models.TaskContext | None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
) -> TaskContext | None:
    """A :class:`flyte_checkpoint.TaskContext` for a running Flyte task, or ``None`` outside one.

    Its ``checkpoint_paths`` are the SDK's, its ``data`` *is* the SDK context's ``data`` dict (so
    the checkpoint helper cached there is shared with ``flyte.ctx().checkpoint``), its run and
    action names are those of the running action, and its ``attempt_number`` is the action's
    (see the module's notes on local mode). As in the SDK, a JobSet whole-set restart
    (``JOBSET_RESTART_ATTEMPT`` > 0) restores from this attempt's own destination, where the
    attempt that was restarted saved.
    """
    if not sdk_context:  # None, or the SDK's falsy null context outside a task
        return None
    action = getattr(sdk_context, "task_action", None) or sdk_context.action
    return TaskContext(
        checkpoint_paths=_checkpoint_paths(sdk_context),
        run_name=action.run_name,
        action_name=action.name,
        storage_options=storage_options,
        transfer=transfer,
        attempt_number=_attempt_number(sdk_context, action),
        data=sdk_context.data,
    )


def _attempt_number(sdk_context: flyte.models.TaskContext, action: flyte.models.ActionID) -> int:
    if sdk_context.mode != "local":
        return int(sdk_context.attempt_number)
    run = (action.run_name, action.name, sdk_context.run_start_time)  # a reused run name is a new run
    return _local_attempts.number_of(sdk_context.data, run)


def _checkpoint_paths(sdk_context: flyte.models.TaskContext) -> CheckpointPaths | None:
    paths = sdk_context.checkpoint_paths
    if paths is None:
        return None
    destination, previous = paths.checkpoint_path, paths.prev_checkpoint_path
    restart = getattr(sdk_context, "restart_attempt", None)
    if restart and destination is not None and destination.strip():
        previous = destination
    return CheckpointPaths(checkpoint_path=destination, prev_checkpoint_path=previous)


def _installed_context(sdk_context: flyte.models.TaskContext | None) -> TaskContext | None:
    """:func:`task_context_from_flyte` with the ``storage_options`` and ``transfer`` of
    :func:`install`, if it ran."""
    installation = _installation
    if installation is None:
        return task_context_from_flyte(sdk_context)
    return task_context_from_flyte(
        sdk_context, storage_options=installation.storage_options, transfer=installation.transfer
    )


def _running_flyte_task() -> TaskContext | None:
    """The context provider :func:`install` registers: the running Flyte task, if any."""
    return _installed_context(flyte.ctx())


def checkpoint() -> Checkpoint | None:
    """The running Flyte task attempt's :class:`flyte_checkpoint.Checkpoint`, typed as such.

    The same helper as ``flyte.ctx().checkpoint`` after :func:`install` (which type checkers see
    as the SDK's ``flyte.Checkpoint``, rejecting e.g. ``save(..., background=True)``) and as
    ``flyte_checkpoint.ctx().checkpoint``. ``None`` outside a Flyte task, or when the task has no
    checkpoint destination. Works without :func:`install` too, with its ``storage_options`` and
    ``transfer`` if it ran.
    """
    context = _running_flyte_task()
    return context.checkpoint if context is not None else None


def _checkpoint_of(sdk_context: flyte.models.TaskContext) -> Checkpoint | None:
    """This attempt's :class:`flyte_checkpoint.Checkpoint`, built on first access, then cached.

    ``None`` when the task has no checkpoint paths, or its destination is empty. Installed as
    ``flyte.models.TaskContext.checkpoint`` by :func:`flyte_checkpoint.integrations.flyte.install`;
    :func:`flyte_checkpoint.integrations.flyte.checkpoint` returns the same helper, typed as ours.
    """
    context = _installed_context(sdk_context)
    return context.checkpoint if context is not None else None


def _grace_seconds() -> float | None:
    installation = _installation
    return installation.grace_seconds if installation is not None else None


def _preemptible(execute: _Execute) -> _Execute:
    """``execute`` of a task attempt, run with the preemption handler; a preemption ends it with
    the SDK's system error (see the module docstring)."""

    @functools.wraps(execute)
    async def execute_preemptible(self: Any, *args: Any, **kwargs: Any) -> Any:
        with install_preemption_handler(grace_seconds=_grace_seconds()):
            try:
                return await ended_on_preemption(execute(self, *args, **kwargs))
            except Preempted as preempted:
                raise _system_error(preempted) from preempted
            except Exception as failure:
                ending = notice.preemption_of(failure)
                if ending is None:
                    raise
                raise _system_error(ending) from failure

    return execute_preemptible


class _LocalPreemptions:
    """The ``Preempted`` that ended the last preempted local attempt, for its run to end with when
    the SDK does not retry it (the notice, and so a preemption, is process-wide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Preempted | None = None

    def record(self, preempted: Preempted) -> None:
        with self._lock:
            self._last = preempted

    def take(self) -> Preempted | None:
        with self._lock:
            last, self._last = self._last, None
            return last


_local_preemptions = _LocalPreemptions()


def _system_error(preempted: Preempted) -> flyte.errors.RuntimeSystemError:
    """The SDK's error for a preempted attempt. A local attempt (in this process, with the SDK's
    retries next in this process too) also forgets the notice, so the retry starts without it, as
    a new pod does, and leaves the ``Preempted`` for the run to end with if none follows."""
    sdk_context = flyte.ctx()
    if sdk_context is not None and sdk_context.mode == "local":
        notice.clear()
        _local_preemptions.record(preempted)
    return flyte.errors.RuntimeSystemError(PREEMPTED_ERROR_CODE, describe_error(preempted))


@contextmanager
def _local_run_preemption(local: bool) -> Iterator[None]:
    """Around a local run started in the main thread: the preemption handler for its length, and
    its end as the ``Preempted`` of its last attempt when that was preempted and not retried."""
    if not local or threading.current_thread() is not threading.main_thread():
        yield
        return
    _local_preemptions.take()  # a run before this one in the process is no business of this one
    with install_preemption_handler(grace_seconds=_grace_seconds()):
        try:
            yield
        except flyte.errors.RuntimeSystemError as error:
            preempted = _local_preemptions.take() if error.code == PREEMPTED_ERROR_CODE else None
            if preempted is None:
                raise
            raise preempted from error


class _LocalRunEntry:
    """``flyte.run``, or a run context's bound ``run``: calls, and ``.aio`` awaits, the SDK's own
    under :func:`_local_run_preemption` when ``local()`` says the run is a local one."""

    def __init__(self, original: Any, local: Callable[[], bool]) -> None:
        self._original = original
        self._local = local
        self.__doc__ = original.__doc__  # help(flyte.run) shows the SDK's documentation
        self.__wrapped__ = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _local_run_preemption(self._local()):
            return self._original(*args, **kwargs)

    def aio(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        local = self._local()  # now, in the caller's thread (the main thread, for a script's loop)
        return self._aio(local, args, kwargs)

    async def _aio(self, local: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with _local_run_preemption(local):
            return await self._original.aio(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


class _RunnerRun:
    """Replaces the SDK's ``run`` descriptor on its run-context class: bound, a :class:`_LocalRunEntry`
    local when the run context's mode is ``"local"``."""

    def __init__(self, original: Any) -> None:
        self.original = original

    def __get__(self, instance: Any, owner: type[Any] | None = None) -> Any:
        bound = self.original.__get__(instance, owner)
        if instance is None:
            return bound
        return _LocalRunEntry(bound, functools.partial(_is_local, instance))


class _RunFunction(_LocalRunEntry):
    """``flyte.run``: pickled by reference, as the SDK's own is (a task may close over it)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_sdk_run, ())


def _sdk_run() -> Any:
    """``flyte.run`` as the unpickling process has it (ours where the plugin is installed)."""
    return flyte._run.run


def _runs_locally() -> bool:
    """Whether ``flyte.run`` runs locally: it runs in a default run context, local without a
    configured client; asked of one, so the answer is the SDK's own."""
    return _is_local(flyte._run._Runner())


def _is_local(runner: object) -> bool:
    return getattr(runner, "_mode", None) == "local"


def _sdk_version() -> str:
    try:
        return importlib.metadata.version("flyte")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - flyte imported above
        return "unknown"


def _release(version: str) -> tuple[int, ...]:
    """The leading numeric release of ``version`` (``"2.12.1rc0"`` -> ``(2, 12, 1)``)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _check_sdk(sdk_class: type[Any], version: str) -> None:
    field_names = {field.name for field in dataclasses.fields(sdk_class)}
    if "checkpoint_paths" not in field_names:
        raise ConfigurationError(
            f"flyte {version} has no checkpoint_paths on its TaskContext (they arrived in flyte "
            f"{'.'.join(map(str, _FIRST_SUPPORTED))}), so there is nothing to build a checkpoint "
            f"from; install a supported SDK: pip install 'flyte{SUPPORTED_FLYTE_VERSIONS}' "
            "(or the flyte-checkpoint[flyte] extra)"
        )
    release = _release(version)
    if release and (release < _FIRST_SUPPORTED or release[:2] >= _FIRST_UNTESTED):
        warnings.warn(
            f"flyte_checkpoint's Flyte plugin is tested with flyte{SUPPORTED_FLYTE_VERSIONS}, not "
            f"flyte {version}; it checks the task context's shape, but report any surprise",
            stacklevel=3,
        )


def install(
    *,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    grace_seconds: float | None = None,
) -> None:
    """Make ``flyte.ctx().checkpoint`` (and :func:`flyte_checkpoint.ctx`) use this package, and
    run every task attempt with the preemption handler.

    Idempotent: a second call changes nothing but ``storage_options``, ``transfer`` and
    ``grace_seconds``. ``storage_options`` are handed to every helper built for a Flyte task
    (fsspec options, e.g. an S3 endpoint); by default the backends read credentials from the
    environment as usual. ``transfer`` (:class:`~flyte_checkpoint.TransferSettings`) is this
    package's own transfer settings for those helpers.
    ``grace_seconds`` is the time from SIGTERM to the SIGKILL (the pod's
    ``terminationGracePeriodSeconds``); ``None`` reads ``FLYTE_CHECKPOINT_GRACE_SECONDS`` when
    each attempt starts, 30 s when unset.

    Raises:
        ConfigurationError: the installed SDK predates ``checkpoint_paths`` (flyte < 2.1.3),
            ``transfer`` is not a :class:`~flyte_checkpoint.TransferSettings`, or
            ``grace_seconds`` is not a number of seconds > 0.
    """
    global _installation
    if grace_seconds is not None:
        grace_seconds = check_grace_seconds(grace_seconds)
    check_transfer_settings(transfer)
    with _lock:
        if _installation is not None:
            _installation.storage_options = storage_options
            _installation.transfer = transfer
            _installation.grace_seconds = grace_seconds
            return
        sdk_class: type[Any] = flyte.models.TaskContext
        _check_sdk(sdk_class, _sdk_version())
        our_property = property(_checkpoint_of, doc=_checkpoint_of.__doc__)
        task_class: type[Any] = flyte.extend.AsyncFunctionTaskTemplate
        original_execute: _Execute = task_class.__dict__[_EXECUTE_NAME]
        runner_class: type[Any] = flyte._run._Runner
        original_runner_run = runner_class.__dict__[_RUN_NAME]
        original_run = flyte._run.run
        _installation = _Installation(
            sdk_class=sdk_class,
            original_property=sdk_class.__dict__.get(_PROPERTY_NAME, _MISSING),
            our_property=our_property,
            storage_options=storage_options,
            transfer=transfer,
            grace_seconds=grace_seconds,
            task_class=task_class,
            original_execute=original_execute,
            our_execute=_preemptible(original_execute),
            runner_class=runner_class,
            original_runner_run=original_runner_run,
            our_runner_run=_RunnerRun(original_runner_run),
            run_modules=(flyte, flyte._run),
            original_run=original_run,
            our_run=_RunFunction(original_run, _runs_locally),
        )
        setattr(sdk_class, _PROPERTY_NAME, our_property)
        setattr(task_class, _EXECUTE_NAME, _installation.our_execute)
        setattr(runner_class, _RUN_NAME, _installation.our_runner_run)
        for module in _installation.run_modules:
            setattr(module, _RUN_NAME, _installation.our_run)
        register_context_provider(_running_flyte_task)
        logger.debug(
            "flyte.ctx().checkpoint now returns flyte_checkpoint.Checkpoint (flyte %s)", _sdk_version()
        )


def uninstall() -> None:
    """Undo :func:`install`: the SDK's own ``TaskContext.checkpoint`` (or none) comes back.

    Idempotent. Helpers already built stay usable; new accesses build the SDK's helper again, and
    :func:`flyte_checkpoint.ctx` no longer sees Flyte tasks.
    """
    global _installation
    with _lock:
        installation = _installation
        if installation is None:
            return
        _installation = None
        unregister_context_provider(_running_flyte_task)
        if installation.sdk_class.__dict__.get(_PROPERTY_NAME) is installation.our_property:
            if isinstance(installation.original_property, _Missing):
                delattr(installation.sdk_class, _PROPERTY_NAME)
            else:
                setattr(installation.sdk_class, _PROPERTY_NAME, installation.original_property)
        else:
            logger.warning("TaskContext.checkpoint was replaced by someone else since install(); left as is")
        if installation.task_class.__dict__.get(_EXECUTE_NAME) is installation.our_execute:
            setattr(installation.task_class, _EXECUTE_NAME, installation.original_execute)
        else:
            logger.warning(
                "AsyncFunctionTaskTemplate.execute was replaced by someone else since install(); left as is"
            )
        _put_back(installation.runner_class, installation.our_runner_run, installation.original_runner_run)
        for module in installation.run_modules:
            _put_back(module, installation.our_run, installation.original_run)


def _put_back(owner: object, ours: object, original: object) -> None:
    """``owner.run`` back to the SDK's, unless someone replaced ours since install()."""
    if vars(owner).get(_RUN_NAME) is ours:
        setattr(owner, _RUN_NAME, original)
    else:
        logger.warning("%s.run was replaced by someone else since install(); left as is", owner)


def is_installed() -> bool:
    """Whether ``flyte.ctx().checkpoint`` currently returns a :class:`flyte_checkpoint.Checkpoint`
    and task attempts run with the preemption handler."""
    installation = _installation
    return (
        installation is not None
        and installation.sdk_class.__dict__.get(_PROPERTY_NAME) is installation.our_property
        and installation.task_class.__dict__.get(_EXECUTE_NAME) is installation.our_execute
        and installation.runner_class.__dict__.get(_RUN_NAME) is installation.our_runner_run
    )
