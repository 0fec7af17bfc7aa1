"""What crosses the Ray shells' process boundary, in one place each.

host_only applies the rule "nothing that leaves a learner or an env runner holds a device
tensor" (core/hostcopy.py): every public method of a decorated shell returns its value through
to_host, so a method added later keeps the rule without its author having to remember it.
Started hands a constructor's error back as the error it is.
"""
from __future__ import annotations

import functools
import inspect
import os

from distppo.core.hostcopy import to_host


def host_only(cls: type) -> type:
    """Wrap each public method defined on `cls` so that its return value is on the CPU."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or not inspect.isfunction(method):
            continue
        setattr(cls, name, _returning_host(method))
    cls.__host_only__ = True
    return cls


def _returning_host(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        return to_host(method(*args, **kwargs))
    return wrapper


class Started:
    """A shell whose constructor keeps the error it met in `failed` (a user's mistake, envs it
    could not build) instead of raising it: Ray hands an error raised in a constructor back
    only as text, while the runtime tells those errors apart by their type."""

    failed: Exception | None = None

    def started(self) -> int:
        """This process's pid, once its constructor is done; the error it kept raises here."""
        if self.failed is not None:
            raise self.failed
        return os.getpid()
