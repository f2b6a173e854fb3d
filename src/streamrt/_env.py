"""On/off switches read from ``STREAMRT_*`` environment variables, one spelling rule for all of them.

``1``, ``true``, ``on``, ``yes`` turn a switch on and ``0``, ``false``, ``off``, ``no`` turn it off (any case); unset
or empty leaves the default. Anything else is refused: ``STREAMRT_FUSED_POSTPROCESS=disabled`` silently meaning
"on" is the kind of quiet wrong answer a user cannot see.

Example:
    >>> import os
    >>> os.environ["STREAMRT_EXAMPLE"] = "Off"
    >>> env_switch("STREAMRT_EXAMPLE", True)
    False
"""

from __future__ import annotations

import os

from streamrt.errors import ConfigError

__all__ = ["env_switch"]

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def env_switch(name: str, default: bool) -> bool:
    """The switch ``name`` from the environment, or ``default`` when unset or empty.

    Raises:
        ConfigError: the variable holds something other than the spellings above.
    """
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"{name}={os.environ[name]!r} is not an on/off value",
                      hint=f"{name}=1 or {name}=0 (also true/false, on/off, yes/no)")
