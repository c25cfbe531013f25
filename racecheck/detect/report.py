"""Race reports a person can act on: the race in one sentence, the streams, the stacks of the
allocation, of the racing access, of the free and of the reusing allocation, and the fix options.

Reports are built by the engine from the access records it already holds and formatted only when
asked (`text()`), so a detector that finds nothing formats nothing. The text avoids raw addresses,
so every rank of a world that hits the same race writes the same report (the trial runner merges
identical texts over ranks).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

from racecheck.detect.stacks import format_stack, innermost

if TYPE_CHECKING:
    from racecheck.detect.shadow import Access


class RaceKind(enum.StrEnum):
    REUSE = "free-while-in-use"  # an allocation reused bytes another stream may still access
    READ_AFTER_WRITE = "read-after-write"
    WRITE_AFTER_READ = "write-after-read"
    WRITE_AFTER_WRITE = "write-after-write"


@dataclasses.dataclass(eq=False)
class RaceReport:
    kind: RaceKind
    earlier: Access  # the access not ordered before `later`
    later: Access  # the racing access, or the reusing allocation (op "allocation")
    count: int = 1  # how often this race (same streams, ops and stacks) was seen

    # -- the parts ---------------------------------------------------------------------------
    @property
    def buffer(self):
        """The allocation whose bytes the earlier access touched."""
        return self.earlier.alloc

    @property
    def reused(self) -> bool:
        """Whether the two accesses touched different allocations of the same bytes."""
        return self.kind is RaceKind.REUSE or self.earlier.alloc is not self.later.alloc

    def streams(self) -> tuple[str, str]:
        return self.earlier.domain.name, self.later.domain.name

    # -- text --------------------------------------------------------------------------------
    def sentence(self) -> str:
        e, later = self.earlier, self.later
        t, s = _q(e.domain.name), _q(later.domain.name)
        size = _size(self.buffer.nbytes)
        verb = "writing" if e.is_write else "reading"
        if self.kind is RaceKind.REUSE:
            owner = self.buffer.stream.name if self.buffer.stream is not None else "an unknown stream"
            return (
                f"free-while-in-use: a {size} buffer allocated on stream {_q(owner)} was freed while "
                f"stream {t} could still be {verb} it ({e.op}), and a new allocation on stream {s} "
                f"reused its memory without being ordered after that access."
            )
        what = f"a {size} buffer"
        if self.reused:
            what += " (bytes of an earlier buffer that was freed and reused in between)"
        if self.kind is RaceKind.READ_AFTER_WRITE:
            return (
                f"read-after-write: stream {s} reads ({later.op}) bytes of {what} that stream {t} "
                f"wrote ({e.op}) without being ordered after that write."
            )
        if self.kind is RaceKind.WRITE_AFTER_READ:
            return (
                f"write-after-read: stream {s} writes ({later.op}) bytes of {what} that stream {t} "
                f"reads ({e.op}) without being ordered after that read."
            )
        return (
            f"write-after-write: streams {t} ({e.op}) and {s} ({later.op}) write the same bytes of "
            f"{what} with no ordering between them."
        )

    def consequence(self) -> str:
        e, later = self.earlier, self.later
        t, s = _q(e.domain.name), _q(later.domain.name)
        if self.kind is RaceKind.REUSE:
            if e.is_write:
                text = f"The pending write on {t} can land in the new buffer after {s} has filled it."
            else:
                text = f"Work on {s} can overwrite the bytes before {t} has read them: silently wrong results."
        elif self.kind is RaceKind.READ_AFTER_WRITE:
            text = f"{s} can read the bytes before {t} has written them."
        elif self.kind is RaceKind.WRITE_AFTER_READ:
            text = f"{s} can overwrite the bytes before {t} has read them."
        else:
            text = "Which write lands last depends on timing."
        if e.domain.inline:
            text += (
                f" (The CPU emulation runs {t} inline on the host, so this cannot fail by timing "
                f"there; on a GPU it can.)"
            )
        return text

    def fixes(self) -> list[str]:
        e, later = self.earlier, self.later
        t, s = e.domain.name, later.domain.name
        out = []
        if self.kind is not RaceKind.REUSE:
            done = "write" if e.is_write else "read"
            out.append(
                f"make {_q(s)} wait for {_q(t)} before this access: `{s}.wait_stream({t})`, or "
                f"`{s}.wait_event(ev)` with `ev` recorded on {_q(t)} after its {done} ({e.op}); "
                f"or issue both on one stream"
            )
        if self.reused:
            owner = self.buffer.stream.name if self.buffer.stream is not None else "its allocation stream"
            out += [
                f"allocate the buffer on the stream that uses it last ({_q(t)}), e.g. lazily inside "
                f"`with runtime.stream({t})` (`torch.cuda.stream(...)`), so that its free returns the "
                f"block to the pool of {_q(t)}, where every reuse is ordered after that use",
                f"call record_stream on it for {_q(t)} (`runtime.record_stream(buf, {t})` or "
                f"`buf.record_stream({t})`) before its last reference is dropped, so the allocator holds "
                f"the block until {_q(t)} has passed the free",
                f"hold a reference to it with an event recorded on {_q(t)} after its last use, and drop "
                f"the reference only after {_q(owner)} waited on that event (FSDP2's way)",
            ]
        return out

    def summary(self) -> str:
        """One line: the sentence's head with the two innermost user frames."""
        return (
            f"{self.kind.value} between {_q(self.earlier.domain.name)} ({self.earlier.op} at "
            f"{innermost(self.earlier.stack)}) and {_q(self.later.domain.name)} ({self.later.op} at "
            f"{innermost(self.later.stack)})"
        )

    def text(self) -> str:
        e, later, buf = self.earlier, self.later, self.buffer
        owner = buf.stream.name if buf.stream is not None else "unknown"
        lines = [
            f"racecheck detected a race: {self.sentence()}",
            f"  {self.consequence()}",
            f"  streams: earlier {'write' if e.is_write else 'read'} on {_q(e.domain.name)}, "
            f"later {'allocation' if self.kind is RaceKind.REUSE else ('write' if later.is_write else 'read')} "
            f"on {_q(later.domain.name)}; the buffer was allocated on {_q(owner)}",
        ]
        sections = [
            (f"allocation of the buffer (block {buf.serial}, {_size(buf.nbytes)}, on {_q(owner)})", buf.stack),
            (f"racing access: {e.op} ({'write' if e.is_write else 'read'}) on {_q(e.domain.name)}", e.stack),
        ]
        if self.reused:
            if buf.free_stack is not None:
                sections.append(("free of the buffer (its last reference dropped on the host)", buf.free_stack))
            else:
                sections.append(("free of the buffer", None))
            new = later.alloc
            if new is not None and new is not buf:
                sections.append(
                    (
                        f"reusing allocation (block {new.serial}, {_size(new.nbytes)}, on "
                        f"{_q(later.domain.name if self.kind is RaceKind.REUSE else _name(new))})",
                        new.stack,
                    )
                )
        if self.kind is not RaceKind.REUSE:
            sections.append(
                (
                    f"later access: {later.op} ({'write' if later.is_write else 'read'}) on {_q(later.domain.name)}",
                    later.stack,
                )
            )
        for title, stack in sections:
            lines.append(f"  {title}:")
            lines.append(
                format_stack(stack, indent="      ")
                if stack is not None
                else "      (not seen: the free happened outside the detector's view)"
            )
        lines.append("  fix options:")
        lines += [f"    {i}. {fix}" for i, fix in enumerate(self.fixes(), 1)]
        if self.count > 1:
            lines.append(f"  seen {self.count} times")
        return "\n".join(lines)


def _q(name: str) -> str:
    return f"'{name}'"


def _name(alloc) -> str:
    return alloc.stream.name if alloc.stream is not None else "unknown"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes}-byte"


def render(reports: list[RaceReport]) -> str:
    """Every report's text, separated by blank lines (the pytest failure text). Its first line
    names the first race in one sentence, so that a one-line summary of the failure says it."""
    if len(reports) == 1:
        return reports[0].text()
    head = f"racecheck detected {len(reports)} races; the first: {reports[0].sentence()}"
    return "\n\n".join([head] + [r.text() for r in reports])
