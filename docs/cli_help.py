"""A Sphinx directive that shows a ``packer`` command's ``--help``, taken from the command itself
at build time, so the CLI reference cannot drift from the code: ``{cli-help} convert``."""

from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


class CliHelp(SphinxDirective):
    """``{cli-help} COMMAND [SUBCOMMAND]``: the literal ``packer ... --help`` text."""

    required_arguments = 0
    optional_arguments = 2

    def run(self) -> list[nodes.Node]:
        from click.testing import CliRunner

        from packer.cli.app import main

        args = [*self.arguments, "--help"]
        result = CliRunner().invoke(main, args, prog_name="packer", terminal_width=100)
        if result.exit_code != 0:
            raise self.error(f"packer {' '.join(args)} failed: {result.output}")
        return [nodes.literal_block(result.output, result.output)]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("cli-help", CliHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
