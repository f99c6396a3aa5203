"""Symbolic links: the one check used on save and on load."""

from __future__ import annotations

import os
import posixpath
import stat
from collections import deque

_MAX_LINK_FOLLOWS = 40
"""Links followed while checking one symbolic link, as many as Linux follows (MAXSYMLINKS)."""
_MAX_RESOLVE_STEPS = 4096
"""Path components walked while checking one symbolic link; a longer walk is refused."""


def link_target_problem(name: str, target: str, where: str) -> str | None:
    """What is wrong with ``target`` for a link named ``name``, judged from the text alone."""
    if not target:
        return "an empty target"
    if "\x00" in target:
        return "a target with a NUL byte"
    if target.startswith("/"):
        return f"an absolute path, outside {where}"
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        return f"which climbs with '..' outside {where}"
    return None


def link_resolution_problem(root: str, name: str, target: str, where: str) -> str | None:
    """Follow ``target`` from the link ``name`` through the tree at ``root`` as the kernel would.

    Returns why it leaves ``root`` (or cannot be checked), or ``None`` when it stays inside.
    Components that do not exist are taken lexically (as directories someone may create later),
    so a dangling link passes only if it would stay inside whatever is created under it. Unlike
    ``os.path.realpath``, this never gives up and continues lexically on an error, and it is the
    same code on every Python version.
    """
    stack = name.split("/")[:-1]  # the link's own directory: real directories, made by us
    real = len(stack)  # how many leading components of ``stack`` exist as directories
    pending = deque(target.split("/"))
    follows = steps = 0
    while pending:
        steps += 1
        if steps > _MAX_RESOLVE_STEPS:
            return f"which takes over {_MAX_RESOLVE_STEPS} steps to follow: too many to check it stays inside"
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return f"which resolves outside {where}"
            stack.pop()
            real = min(real, len(stack))
            continue
        stack.append(part)
        if real < len(stack) - 1:
            continue  # below something that does not exist (or is a file): lexical from here
        path = os.path.join(root, *stack)
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            return f"which cannot be followed to check it stays inside {where} ({exc.strerror})"
        if stat.S_ISLNK(mode):
            follows += 1
            if follows > _MAX_LINK_FOLLOWS:
                return (
                    f"which is a loop or a chain of over {_MAX_LINK_FOLLOWS} links, unusable inside {where}"
                )
            link_target = os.readlink(path)
            stack.pop()
            if link_target.startswith("/"):
                return f"which goes through a link to an absolute path, outside {where}"
            pending.extendleft(reversed(link_target.split("/")))
        elif stat.S_ISDIR(mode):
            real = len(stack)
    return None
