"""chstate for Meltano: the `clickhouse` and `chdb` state backends, whose state
logic is chstate's C++ core loaded through its C ABI (see README.md).

Meltano finds the backends and their settings through entry points; nothing
needs importing by hand. This module imports no Meltano code, so
`chstate_meltano._native` works without Meltano installed.
"""

__version__ = "0.1.0"
