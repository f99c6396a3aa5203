"""What a component must offer to be checkpointed, and how its state is captured and restored.

Two small protocols, checked structurally:

* :class:`Stateful` — ``state_dict()`` / ``load_state_dict(state)`` (PyTorch's convention); the
  library serialises the state (pickle by default, any :class:`Serializer`).
* :class:`FileComponent` — ``save_to_path(path)`` / ``load_from_path(path)`` for components that
  stream their own data: "write your part to this file" and "read your part from this file".

A component with both is treated as a :class:`FileComponent`: it asked to stream.
"""

from __future__ import annotations

import pickle
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from flyte_checkpoint.errors import CheckpointError, UnsupportedTypeError
from flyte_checkpoint.state.safe_pickle import loads_state

if TYPE_CHECKING:
    from ray.actor import ActorHandle

FILE_ENCODING = "file"
"""Encoding of a part whose bytes a component (or caller) wrote as a file."""
BYTES_ENCODING = "bytes"
"""Encoding of a part given as raw bytes."""


@runtime_checkable
class Stateful(Protocol):
    """A component whose state the library serialises: ``state_dict()`` and ``load_state_dict()``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> object: ...


@runtime_checkable
class FileComponent(Protocol):
    """A component that writes its own part to a file, and reads it back from one."""

    def save_to_path(self, path: Path, /) -> object:
        """Write the component's whole state to the regular file ``path`` (which does not exist)."""
        ...

    def load_from_path(self, path: Path, /) -> object:
        """Replace the component's state with the one in the file ``path``."""
        ...


Component: TypeAlias = Stateful | FileComponent
"""What a controller or a part may be: an object with ``state_dict()``/``load_state_dict(state)``
(:class:`Stateful`) or with ``save_to_path(path)``/``load_from_path(path)`` (:class:`FileComponent`)."""
ComponentOrActor: TypeAlias = "Component | ActorHandle[Any] | type[Any]"
"""A component, or a Ray actor handle whose actor is one (``.remote()`` is typed ``ActorHandle[T] |
type[T]``); see :mod:`flyte_checkpoint.state.ray`."""
ComponentKind = Literal["state", "file"]


@runtime_checkable
class Serializer(Protocol):
    """Turns a ``state_dict()`` into bytes and back. ``name`` is recorded with every part."""

    @property
    def name(self) -> str: ...

    def dumps(self, obj: Any, /) -> bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


@dataclass(frozen=True)
class PickleSerializer:
    """The default serializer: pickle, loading only what a state dict holds unless trusted.

    By default a load resolves only builtin containers and scalars, numpy arrays and torch
    tensors (see :mod:`flyte_checkpoint.state.safe_pickle`) and refuses anything else with
    :class:`~flyte_checkpoint.errors.UntrustedContentError`: a pickle can name code to run, and
    anyone who can write the store could otherwise run it in every job that resumes.
    ``trusted=True`` unpickles anything, for stores whose every writer is trusted and states
    holding other objects. Both write the same bytes, recorded as ``"pickle"``.
    """

    protocol: int = pickle.HIGHEST_PROTOCOL
    name: str = "pickle"
    trusted: bool = False

    def dumps(self, obj: Any, /) -> bytes:
        return pickle.dumps(obj, protocol=self.protocol)

    def loads(self, data: bytes, /) -> Any:
        if self.trusted:
            return pickle.loads(data)
        return loads_state(data)


PICKLE = PickleSerializer()


def kind_of(component: object, label: str) -> ComponentKind:
    """Which protocol ``component`` follows; a clear error when it follows neither."""
    if isinstance(component, FileComponent):
        return "file"
    if isinstance(component, Stateful):
        return "state"
    raise UnsupportedTypeError(
        f"{label} is a {type(component).__name__}, which cannot be checkpointed: give an object "
        "with state_dict()/load_state_dict(state), or one with save_to_path(path)/"
        "load_from_path(path)"
    )


@dataclass(frozen=True)
class Payload:
    """One object's content as captured before any byte is written: bytes, or a private file."""

    data: bytes | Path
    encoding: str


def capture(component: object, kind: ComponentKind, serializer: Serializer, path: Path) -> Payload:
    """The component's state now, detached from it (later mutations cannot reach it).

    A :class:`Stateful` state is serialised at once, because ``state_dict()`` may hand out
    references to live objects (PyTorch tensors are); a :class:`FileComponent` writes ``path``.
    """
    if kind == "file":
        assert isinstance(component, FileComponent)
        component.save_to_path(path)
        check_regular_file(path, f"{type(component).__name__}.save_to_path")
        return Payload(path, FILE_ENCODING)
    assert isinstance(component, Stateful)
    data = serializer.dumps(component.state_dict())
    if not isinstance(data, bytes):
        raise UnsupportedTypeError(
            f"serializer {serializer.name!r} returned {type(data).__name__}, not bytes"
        )
    return Payload(data, serializer.name)


def check_regular_file(path: Path, producer: str) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{producer} did not write its file {path}") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{producer} must write a regular file at {path}, not a directory or link")


def restore(component: object, kind: ComponentKind, value: Any) -> None:
    """Apply a staged value: a deserialised state, or (for a :class:`FileComponent`) a file path."""
    if kind == "file":
        assert isinstance(component, FileComponent)
        assert isinstance(value, Path)
        component.load_from_path(value)
    else:
        assert isinstance(component, Stateful)
        component.load_state_dict(value)


def describe_exception(exc: BaseException) -> str:
    """``"ValueError: boom"``: the form a cause takes in this package's messages."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
