"""host_only: the one place where the rule "nothing that leaves a learner or an env runner
holds a device tensor" (core/hostcopy.py) is applied to the Ray shells.

Every public method of a decorated shell returns its value through to_host, so a method
added later keeps the rule without its author having to remember it.
"""
from __future__ import annotations

import functools
import inspect

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
