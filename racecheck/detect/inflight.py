"""A collective being issued, as the PyTorch tracker follows it (torch_tracker.py): the stream it
runs on, once known, and whether its accesses have been charged; on the native path its log
items wait here for the collective's end."""

from __future__ import annotations


class InFlight:
    """A collective in flight, issued from the stream `issuer`."""

    __slots__ = ("plan", "args", "kwargs", "issuer", "stream", "charged", "native")

    def __init__(self, plan, args, kwargs, issuer: int) -> None:
        self.plan, self.args, self.kwargs = plan, args, kwargs
        self.issuer = issuer
        self.stream: int | None = None  # a stream other than the issuer that waited during the call
        self.charged = False
        self.native: tuple | None = None  # on the native path: (stack, log items) instead of args
