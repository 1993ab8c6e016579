"""The one exception type for errors a user can cause.

Every message says what is wrong and what to do about it; the CLI prints it and exits 2,
the app shows it in place of the result and keeps running.
"""


class SatError(Exception):
    """A user-facing error: bad image, bad checkpoint, bad dataset file, bad flag."""


class ImageError(SatError):
    """An image that cannot be read or is refused (empty, corrupt, too large, ...)."""


class CheckpointError(SatError):
    """A checkpoint that cannot be loaded safely or does not match its config."""


class DatasetError(SatError):
    """A dataset file or image folder that cannot be used."""


class RetiredOptionError(SatError):
    """A stored config that uses an option this version no longer has (``config.RETIRED``)."""
