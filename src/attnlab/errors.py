"""One exception type for bad input that the user can fix.

`train.py` and `eval.py` catch it and print its message alone (no library traceback), so the
message must name the problem *and* the fix.
"""


class ConfigError(ValueError):
    """Bad configuration or input: the message says what is wrong and how to fix it."""


class DataError(ConfigError):
    """Missing, corrupt or malformed data files: the message names the file and what to do."""
