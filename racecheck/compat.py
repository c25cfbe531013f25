"""Old import paths of modules that moved, kept working with a DeprecationWarning.

racecheck's modules were regrouped into packages that name the architecture (suites/, runner/,
results/, cli/, scenario_kit/). A user's code may still import the old paths
(`racecheck.trials.tally`, `racecheck.harness`, ...): `MOVED` maps each old module to its new one,
and `install()` (called by racecheck/__init__.py) puts a finder on `sys.meta_path` that answers an
old name with the new module itself, so `import racecheck.trials.tally`, `from
racecheck.trials.tally import summarize` and `from racecheck.trials import tally` all get the one
module object (its globals, monkeypatching included), after a DeprecationWarning that names the new
path. No file is left at an old path: git follows every move as a rename.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings
from pathlib import Path

_TRIALS_INIT = str(Path(__file__).with_name("trials") / "__init__.py")

MOVED = {
    # suites/: what the runner runs (the catalogue and a project's own [tool.racecheck] suite)
    "racecheck.trials.catalogue": "racecheck.suites.catalogue",
    "racecheck.trials.config": "racecheck.suites.project",
    # runner/: arms in blocks, sessions, ranks, the run folder, nodes
    "racecheck.trials.runner": "racecheck.runner.trial_runner",
    "racecheck.trials.schedule": "racecheck.runner.blocks",
    "racecheck.trials.session": "racecheck.runner.session",
    "racecheck.trials.launch": "racecheck.runner.launch",
    "racecheck.trials.lifeline": "racecheck.runner.lifeline",
    "racecheck.trials.ranks": "racecheck.runner.ranks",
    "racecheck.trials.record": "racecheck.runner.record",
    "racecheck.trials.state": "racecheck.runner.state",
    "racecheck.trials.interrupts": "racecheck.runner.interrupts",
    "racecheck.trials.gitarms": "racecheck.runner.gitarms",
    "racecheck.trials.stopping": "racecheck.runner.stopping",
    "racecheck.trials.shard_env": "racecheck.runner.shard_env",
    "racecheck.trials.progress": "racecheck.runner.progress",
    "racecheck.trials.merge": "racecheck.runner.merge",
    "racecheck.trials.nodes": "racecheck.runner.nodes",
    "racecheck.trials.node_writer": "racecheck.runner.node_writer",
    "racecheck.trials.node_follower": "racecheck.runner.node_follower",
    # results/: tally, statistics, the gate, the renderers
    "racecheck.trials.tally": "racecheck.results.tally",
    "racecheck.trials.stats": "racecheck.results.stats",
    "racecheck.trials.gate": "racecheck.results.gate",
    "racecheck.trials.report": "racecheck.results.report",
    "racecheck.trials.render_html": "racecheck.results.render_html",
    "racecheck.trials.render_junit": "racecheck.results.render_junit",
    "racecheck.trials.perturb_notes": "racecheck.results.perturb_notes",
    # cli/: the click commands and their option parsing
    "racecheck.trials.cli_commands": "racecheck.cli.commands",
    "racecheck.trials.run_options": "racecheck.cli.run_options",
    "racecheck.trials.node_options": "racecheck.cli.node_options",
    # scenario_kit/: what the catalogue's suites are built from
    "racecheck.harness": "racecheck.scenario_kit.harness",
    "racecheck.mlp_parity": "racecheck.scenario_kit.mlp_parity",
    "racecheck.fsdp_parity": "racecheck.scenario_kit.fsdp_parity",
    # files renamed for what they hold
    "racecheck.perturb.schedule": "racecheck.perturb.decisions",
    "racecheck.fsdp.schedule": "racecheck.fsdp.prefetch_order",
}


def warn_moved(old: str, new: str) -> None:
    """The DeprecationWarning, attributed to the importing line (the first frame outside the
    import machinery and this module), so that Python's default filters show it there."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_filename in (__file__, _TRIALS_INIT)
    ):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1  # warnings skips the import machinery's frames itself
        frame = frame.f_back
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old path will go)", DeprecationWarning, stacklevel=level
    )


class _Alias:
    """Finds the old names of MOVED, and loads each as the module at its new name: a meta path
    finder and loader by protocol (importlib.abc would import importlib.resources, tempfile and
    more on every `racecheck --help`)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warn_moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """Nothing to run: the new module was executed under its own name."""


_FINDER = _Alias()


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
