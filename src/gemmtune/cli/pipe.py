"""A reader of stdout that goes away (`gemmtune tune ... | head -2`): the command stops quietly, exit 0.

Python ignores SIGPIPE, so a write to a pipe whose reader has closed raises BrokenPipeError.  The
command checks that it was stdout that closed (not, say, a worker's pipe: that is an error), then
points stdout at /dev/null, as Python's documentation of SIGPIPE advises, so that the buffered rest
is not written again at exit.
"""

from __future__ import annotations

import os
import sys

__all__ = ["stdout_closed", "reader_gone"]


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (False where that cannot be told).

    Example:
        >>> stdout_closed()  # a terminal, a file, an open pipe, or (here) no file descriptor at all
        False
    """
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no file descriptor
        return False


def reader_gone() -> int:
    """Point stdout at /dev/null (what is still buffered is dropped there); returns the exit status, 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return 0
