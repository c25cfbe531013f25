"""The `racecheck` command line: a click group whose commands are thin shells over the library.

The commands live in run.py (`run`) and commands.py (`report`, `gate`, `plan`, `merge`, `list`,
`build-native`); `main` maps racecheck's own errors to the documented exit codes (exitcodes.py). Heavy imports
(torch, pandas, scipy) happen inside the commands, so that `racecheck --help` is instant.
"""

from __future__ import annotations

import os
import sys

import click

from racecheck.cli.commands import COMMANDS
from racecheck.cli.console import say, surviving_closed_console
from racecheck.cli.run import run_command
from racecheck.exitcodes import ExitCode, InfrastructureError, InputError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="racecheck")
def cli() -> None:
    """Make stream/allocator races happen on demand, prove fixes, and gate CI on the evidence."""


def main() -> None:
    """Console entry point: maps racecheck's own errors to the documented exit codes. A console
    that closes (`racecheck run ... | head`) costs the output, never the run; one on a disk that
    refused what the command printed makes a command that succeeded exit 3 (console.py)."""
    with surviving_closed_console() as console:
        try:
            _main()
        except SystemExit as exc:
            refused = console.refused()
            if exc.code in (None, ExitCode.OK) and refused:
                say(f"racecheck: infrastructure error: cannot write {refused}; what the command printed is incomplete")
                sys.exit(ExitCode.INFRASTRUCTURE)
            raise


def _main() -> None:
    try:
        os.getcwd()
    except FileNotFoundError:  # the shell's folder was removed under it: nothing relative resolves
        say("racecheck: error: the current folder no longer exists; cd into one that does")
        sys.exit(ExitCode.USAGE)
    try:
        rc = cli.main(prog_name="racecheck", standalone_mode=False)
    except click.exceptions.Abort:
        say("racecheck: aborted")
        sys.exit(ExitCode.INTERRUPTED)
    except click.UsageError as exc:
        # One line, no traceback: usage mistakes exit 2 as click's own convention does.
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        say(f"racecheck: error: {exc.format_message()}{hint}")
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        say(f"racecheck: error: {exc.format_message()}")
        sys.exit(exc.exit_code)
    except InputError as exc:
        say(f"racecheck: error: {exc}")
        sys.exit(ExitCode.USAGE)
    except InfrastructureError as exc:
        say(f"racecheck: infrastructure error: {exc}")
        sys.exit(ExitCode.INFRASTRUCTURE)
    sys.exit(rc if isinstance(rc, int) else ExitCode.OK)


for _command in (run_command, *COMMANDS):  # run, report, gate, plan, merge, list, build-native
    cli.add_command(_command)
