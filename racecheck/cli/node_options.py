"""`racecheck run`'s options for a world across nodes (--nnodes, --node-rank, --rdzv-*): checked
into a NodeSpec, and the run of a writer (node 0) or a follower node around the trial runner.
See [Note: nodes] in runner/nodes.py. Kept out of run_options.py: one node needs none of it.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import click

from racecheck.cli.console import say


def node_spec(ctx, opts):
    """The NodeSpec of --nnodes/--node-rank/--rdzv-*, or None on one node. A follower's own run
    folder is OUT/nodes/node-R (opts are rewritten to it), so that nodes sharing a file system
    never write the same file."""
    from click.core import ParameterSource

    from racecheck.runner.nodes import NodeSpec, check_resolves, parse_conf, parse_endpoint

    if opts["nnodes"] == 1:
        given = [
            n
            for n in ("node_rank", "rdzv_endpoint", "rdzv_id", "rdzv_conf")
            if ctx.get_parameter_source(n) is ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} needs --nnodes above 1")
        return None
    if not opts["rdzv_endpoint"]:
        raise click.UsageError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT (node 0's address)")
    if opts["node_rank"] >= opts["nnodes"]:
        raise click.BadParameter(
            f"{opts['node_rank']} is not below --nnodes {opts['nnodes']}", param_hint="--node-rank"
        )
    try:
        host, port = parse_endpoint(opts["rdzv_endpoint"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rdzv-endpoint") from None
    try:
        conf = parse_conf(opts["rdzv_conf"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rdzv-conf") from None
    try:
        check_resolves(host, port)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rdzv-endpoint") from None
    spec = NodeSpec(
        nnodes=opts["nnodes"],
        node_rank=opts["node_rank"],
        host=host,
        port=port,
        rdzv_id=opts["rdzv_id"],
        rdzv_conf=conf,
    )
    if not spec.is_writer:
        where = f"nodes/node-{spec.node_rank}"
        if opts["resume_dir"] is not None:
            opts["resume_dir"] = opts["resume_dir"] / where
        else:
            opts["out_dir"] = (opts["out_dir"] or Path("racecheck-out") / time.strftime("run-%Y%m%d-%H%M%S")) / where
    return spec


def writer_for(nodes, config):
    if nodes is None:
        return None
    from racecheck.runner.node_writer import Writer

    return Writer(nodes, config)


@contextlib.contextmanager
def hosting(writer):
    """Within: node 0 hosts the store, has admitted every node, and at the end tells them that
    the run is over (with the error that ended it). A node lost or missing: exit 3."""
    if writer is None:
        yield
        return
    from racecheck.exitcodes import InfrastructureError
    from racecheck.runner.nodes import NodeError

    error = "interrupted"
    try:
        writer.start()
        yield
        error = ""
    except NodeError as exc:
        error = str(exc)
        raise InfrastructureError(error) from None
    except Exception as exc:
        error = str(exc) or type(exc).__name__
        raise
    finally:
        writer.close(error)


def follow(ctx, nodes, config) -> None:
    """A follower node's run: the writer's sessions, until it says the run is over."""
    from racecheck.exitcodes import ExitCode, InfrastructureError
    from racecheck.runner import interrupts
    from racecheck.runner.node_follower import Follower
    from racecheck.runner.nodes import NodeError

    follower = Follower(nodes, config)
    try:
        with interrupts.handled():
            follower.run()
    except KeyboardInterrupt:
        say(f"racecheck: node {nodes.node_rank} interrupted; node 0 ends the session in flight")
        ctx.exit(ExitCode.INTERRUPTED)
    except NodeError as exc:
        raise InfrastructureError(f"node {nodes.node_rank}: {exc}") from None
    click.echo(
        f"node {nodes.node_rank}: ran its part of {follower.sessions} session(s) of node 0's run; "
        f"its logs are in {config.out}"
    )
