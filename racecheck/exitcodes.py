"""The exit-code policy of every racecheck command, in one place (documented in the README)."""

import enum


class ExitCode(enum.IntEnum):
    OK = 0  # done; failures found by trials are data, not errors
    GATE_FAILED = 1  # a gate condition failed
    USAGE = 2  # bad command line or input (click's own code for usage errors)
    INFRASTRUCTURE = 3  # could not start, or the run timed out as a whole
    UNDECIDED = 4  # a gate cannot decide with the trials at hand
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention); finished trials are kept


class InfrastructureError(Exception):
    """Raised when racecheck itself cannot do its job (launch failed, run timed out as a whole)."""


class InputError(Exception):
    """Raised when the user's input cannot be run as given, found only once racecheck tries (a suite
    pytest cannot collect, arguments pytest rejects, a git revision that does not exist, settings
    that do not fit the suites or the machine): exit 2. `option` names the command-line option the
    mistake is in, where one is (`--mesh`), so that the command line can say which."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class SuiteRejected(InputError):
    """An InputError a pytest session found once the run had started (a suite, or one arm's
    revision or pytest arguments, that pytest cannot collect or run): trials of this run may have
    finished before it."""
