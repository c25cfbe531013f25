"""Failure text as the records hold it: writable as UTF-8 (printable) and cut to the line that
names it (first_line, the one-line form of a message or a report wherever one is shown).

A failure's message, a detector report or a node id made from a file name may hold lone
surrogates: os.fsdecode and subprocess output (surrogateescape) turn each byte that is not UTF-8
into one, and no UTF-8 encoder accepts them, so one such record broke every report that writes
UTF-8 (Markdown and the step summary died with UnicodeEncodeError, the JUnit XML was no longer
well-formed, the run's own table died on a strict console). A trial record escapes its text here
once, where every record is made (protocol/records.TrialRecord, for the runner and each reader of a log,
old logs included), rather than in each renderer: every output format, present and future, then
holds only text it can write, and no renderer needs to know.

A command line racecheck prints for a user to run again (a replay, a resume) is one line too, so
a word holding a line break or another control character (a folder named so) is quoted in the
$'...' form that bash, zsh and ksh read back (shell_join); shlex would quote it across lines.
"""

from __future__ import annotations

import re
import shlex

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with each lone surrogate written as an escape: `\\xff` for the byte that
    surrogateescape turned into U+DCFF, `\\ud800` for any other; the rest as it was."""
    if text.isascii():
        return text
    return _LONE_SURROGATE.sub(_escape, text)


def first_line(text: str, limit: int | None = None) -> str:
    """The first line of `text` that is not blank, stripped; cut to `limit` characters, the cut
    marked with "...". "" for text without one."""
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    if limit is None or len(line) <= limit:
        return line
    return line[: limit - 3] + "..."


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


_CONTROL = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shell_word(word: str) -> str:
    """`word` quoted for a shell on one line: as shlex quotes it, or, where it holds a character
    that is not printable, as $'...' with that character escaped (a surrogate as its byte)."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(_CONTROL.get(c) or (c if c.isprintable() else _byte(c)) for c in word) + "'"


def _byte(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shell_join(words: list[str]) -> str:
    """The command line of `words`, one line, for a shell to run again (see shell_word)."""
    return " ".join(shell_word(w) for w in words)
