"""Hooks a higher layer installs for a lower one, kept here so that installing one imports nothing.

`INDUCTOR`: each makes sure Inductor asks gemmtune for its GEMMs and returns True when it does
(False: this torch has no lookup table).  `gemmtune/__init__.py` installs gemmtune.inductor's
installer; `gemmtune.dispatch.route` calls them (that layer does not import gemmtune.inductor).

Example:
    >>> import gemmtune
    >>> from gemmtune.core.hooks import INDUCTOR
    >>> len(INDUCTOR) >= 1
    True
"""

from __future__ import annotations

from typing import Callable

INDUCTOR: list[Callable[[], bool]] = []
