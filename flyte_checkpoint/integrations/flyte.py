"""Flyte SDK plugin: inside a Flyte task, ``flyte.ctx().checkpoint`` is a ``flyte_checkpoint.Checkpoint``.

Install the extra (``pip install 'flyte-checkpoint[flyte]'``) and add one line to the module that
defines your tasks, so it runs wherever that module is imported (your machine and the task's
container alike)::

    import flyte
    import flyte_checkpoint.integrations.flyte

    flyte_checkpoint.integrations.flyte.install()

    env = flyte.TaskEnvironment(name="train")

    @env.task(retries=3)
    def train(n: int) -> int:
        checkpoint = flyte.ctx().checkpoint          # a flyte_checkpoint.Checkpoint
        restored = checkpoint.load_sync()
        ...

What :func:`install` does:

- It replaces the SDK's ``TaskContext.checkpoint`` property (or adds it, on an SDK without one)
  with one that builds ``flyte_checkpoint.Checkpoint(checkpoint_path, prev_checkpoint_path)``
  from the SDK's own ``checkpoint_paths``, with the run and action names of the running action,
  and caches it in the SDK context's ``data`` under :data:`~flyte_checkpoint.CHECKPOINT_CACHE_KEY`,
  so every access in one task attempt returns the same helper, as the SDK's property does.
- It makes :func:`flyte_checkpoint.ctx` see the running Flyte task too (when no
  ``flyte_checkpoint`` context of its own is set), sharing the same cached helper, so task code
  written against ``flyte_checkpoint.ctx()`` runs unchanged under Flyte.

Both are undone by :func:`uninstall`; calling either twice is harmless. The stored format is the
SDK's (one object: bytes or a file as-is, a directory as one ``.tar.gz``), so a checkpoint saved by
the SDK's own helper loads with ours and the other way round, and the SDK's local retries (which
copy ``checkpoint`` to ``prev_checkpoint`` before each retry) resume from what ours saved.

Supported SDK versions: :data:`SUPPORTED_FLYTE_VERSIONS` (the ``flyte`` extra pins them). Versions
before 2.1.3 carry no ``checkpoint_paths`` on the task context and are refused with a clear error.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib.metadata
import logging
import re
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import flyte
import flyte.models

import flyte_checkpoint.context as _context_module
from flyte_checkpoint.checkpoint import Checkpoint
from flyte_checkpoint.context import CheckpointPaths, TaskContext
from flyte_checkpoint.errors import ConfigurationError

__all__ = [
    "SUPPORTED_FLYTE_VERSIONS",
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
_CONTEXT_VAR_NAME = "_current"


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
    original_context_var: contextvars.ContextVar[TaskContext | None] | None


_lock = threading.Lock()
_installation: _Installation | None = None


def task_context_from_flyte(
    sdk_context: flyte.models.TaskContext | None,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> TaskContext | None:
    """A :class:`flyte_checkpoint.TaskContext` for a running Flyte task, or ``None`` outside one.

    Its ``checkpoint_paths`` are the SDK's, its ``data`` *is* the SDK context's ``data`` dict (so
    the checkpoint helper cached there is shared with ``flyte.ctx().checkpoint``), and its run and
    action names are those of the running action. As in the SDK, a JobSet whole-set restart
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
        data=sdk_context.data,
    )


def _checkpoint_paths(sdk_context: flyte.models.TaskContext) -> CheckpointPaths | None:
    paths = sdk_context.checkpoint_paths
    if paths is None:
        return None
    destination, previous = paths.checkpoint_path, paths.prev_checkpoint_path
    restart = getattr(sdk_context, "restart_attempt", None)
    if restart and destination is not None and destination.strip():
        previous = destination
    return CheckpointPaths(checkpoint_path=destination, prev_checkpoint_path=previous)


def _checkpoint_of(sdk_context: flyte.models.TaskContext) -> Checkpoint | None:
    """This attempt's :class:`flyte_checkpoint.Checkpoint`, built on first access, then cached.

    ``None`` when the task has no checkpoint paths, or its destination is empty. Installed as
    ``flyte.models.TaskContext.checkpoint`` by :func:`flyte_checkpoint.integrations.flyte.install`.
    """
    installation = _installation
    options = installation.storage_options if installation is not None else None
    context = task_context_from_flyte(sdk_context, storage_options=options)
    return context.checkpoint if context is not None else None


class _FlyteAwareContextVar:
    """Stands in for ``flyte_checkpoint.context._current``: our own context first, else Flyte's.

    Setting and resetting go to the original context variable, so ``task_context()`` and the
    retry runners behave exactly as before; only a lookup that finds nothing asks the Flyte SDK.
    """

    def __init__(self, inner: contextvars.ContextVar[TaskContext | None]) -> None:
        self.inner = inner

    def get(self) -> TaskContext | None:
        own = self.inner.get()
        if own is not None:
            return own
        installation = _installation
        options = installation.storage_options if installation is not None else None
        return task_context_from_flyte(flyte.ctx(), storage_options=options)

    def set(self, value: TaskContext | None) -> contextvars.Token[TaskContext | None]:
        return self.inner.set(value)

    def reset(self, token: contextvars.Token[TaskContext | None]) -> None:
        self.inner.reset(token)


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


def install(*, storage_options: Mapping[str, Any] | None = None) -> None:
    """Make ``flyte.ctx().checkpoint`` (and :func:`flyte_checkpoint.ctx`) use this package.

    Idempotent: a second call changes nothing but ``storage_options``. ``storage_options`` are
    handed to every helper the property builds (fsspec options, e.g. an S3 endpoint); by default
    the backends read credentials from the environment as usual.

    Raises:
        ConfigurationError: the installed SDK predates ``checkpoint_paths`` (flyte < 2.1.3).
    """
    global _installation
    with _lock:
        if _installation is not None:
            _installation.storage_options = storage_options
            return
        sdk_class: type[Any] = flyte.models.TaskContext
        _check_sdk(sdk_class, _sdk_version())
        our_property = property(_checkpoint_of, doc=_checkpoint_of.__doc__)
        original_property = sdk_class.__dict__.get(_PROPERTY_NAME, _MISSING)
        original_var = _context_module.__dict__.get(_CONTEXT_VAR_NAME)
        if not isinstance(original_var, contextvars.ContextVar):
            logger.warning(
                "flyte_checkpoint.ctx() cannot be bridged to Flyte tasks in this version; "
                "use flyte.ctx().checkpoint inside Flyte tasks"
            )
            original_var = None
        _installation = _Installation(
            sdk_class=sdk_class,
            original_property=original_property,
            our_property=our_property,
            storage_options=storage_options,
            original_context_var=original_var,
        )
        setattr(sdk_class, _PROPERTY_NAME, our_property)
        if original_var is not None:
            # ctx() reads this module global on every call, so replacing it reaches every caller.
            vars(_context_module)[_CONTEXT_VAR_NAME] = _FlyteAwareContextVar(original_var)
        logger.debug(
            "flyte.ctx().checkpoint now returns flyte_checkpoint.Checkpoint (flyte %s)", _sdk_version()
        )


def uninstall() -> None:
    """Undo :func:`install`: the SDK's own ``TaskContext.checkpoint`` (or none) comes back.

    Idempotent. Helpers already built stay usable; new accesses build the SDK's helper again.
    """
    global _installation
    with _lock:
        installation = _installation
        if installation is None:
            return
        _installation = None
        if installation.sdk_class.__dict__.get(_PROPERTY_NAME) is installation.our_property:
            if isinstance(installation.original_property, _Missing):
                delattr(installation.sdk_class, _PROPERTY_NAME)
            else:
                setattr(installation.sdk_class, _PROPERTY_NAME, installation.original_property)
        else:
            logger.warning("TaskContext.checkpoint was replaced by someone else since install(); left as is")
        current_var = _context_module.__dict__.get(_CONTEXT_VAR_NAME)
        if installation.original_context_var is not None and isinstance(current_var, _FlyteAwareContextVar):
            vars(_context_module)[_CONTEXT_VAR_NAME] = installation.original_context_var


def is_installed() -> bool:
    """Whether ``flyte.ctx().checkpoint`` currently returns a :class:`flyte_checkpoint.Checkpoint`."""
    installation = _installation
    return (
        installation is not None
        and installation.sdk_class.__dict__.get(_PROPERTY_NAME) is installation.our_property
    )
