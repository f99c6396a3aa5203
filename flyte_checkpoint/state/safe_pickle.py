"""Unpickling only what a state dict holds, as ``torch.load(weights_only=True)`` does since torch 2.6.

A pickle names the callables that rebuild it, and unpickling calls them: a part written by
anyone who can write the bucket could run any code in every job that resumes from it. This
unpickler resolves only an allowlist of globals -- builtin containers and scalars,
``collections.OrderedDict``/``defaultdict``/``deque``, numpy arrays, dtypes and scalars, and
torch tensors, parameters, sizes, dtypes and devices -- and refuses anything else with
:class:`~flyte_checkpoint.errors.UntrustedContentError` naming it. A torch tensor's storage is
read back through torch's own ``weights_only`` loader, never its full one.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from flyte_checkpoint.errors import UntrustedContentError

_BUILTINS = frozenset(
    {"bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list", "range",
     "set", "slice", "str", "tuple"}
)  # fmt: skip
_ALLOWED = frozenset(
    {
        ("collections", "OrderedDict"),
        ("collections", "defaultdict"),
        ("collections", "deque"),
        ("_codecs", "encode"),  # how protocols 0-2 spell bytes
        *((module, name) for module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray")
          for name in ("dtype", "ndarray", "_reconstruct", "scalar")),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"),
        ("torch", "Size"),
        ("torch", "device"),
    }
)  # fmt: skip
TRUSTED_HINT = (
    "if every writer of this store is trusted, load with serializer=PickleSerializer(trusted=True), "
    "which unpickles anything (and so runs the code a pickle names)"
)


def _torch_storage_from_bytes(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


class _StateDictUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module == "builtins" and name in _BUILTINS) or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _torch_storage_from_bytes
        if module == "torch" and _is_torch_dtype(name):
            return super().find_class(module, name)
        raise UntrustedContentError(
            f"the part names {module}.{name}, which is not state-dict content (builtin containers "
            f"and scalars, numpy arrays, torch tensors): unpickling it could run code, so it was "
            f"refused and nothing of it was run; {TRUSTED_HINT}"
        )


def _is_torch_dtype(name: str) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - a pickle naming torch needs torch to load anyway
        return False
    return isinstance(getattr(torch, name, None), torch.dtype)


def loads_state(data: bytes) -> Any:
    """Unpickle ``data`` if it holds only state-dict content; else :class:`UntrustedContentError`."""
    return _StateDictUnpickler(io.BytesIO(data)).load()
