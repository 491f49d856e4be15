"""The ``dapo`` command line: one entry point for every flow of the pipeline.

Every command takes ``-c/--config`` overlay presets and ``-S section.key=value`` overrides on top of
params.yaml (DVC's convention), and turns expected failures (a bad config key, a missing file) into
a one-line message and a non-zero exit code instead of a traceback. The commands live by group in
``flows/commands/`` (what they share: ``flows.commands.base``); importing them registers them on
one app, in the order ``dapo --help`` lists them.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m flows.cli`: as the `dapo` entry point, before any import
    from flows.signals import until_work_begins

    until_work_begins()
    from flows.environment import apply_defaults

    apply_defaults()  # before torch is imported: it reads its kernel pins once

import importlib
import inspect

import typer

from flows.commands.base import app

# Imported in this order, they register their commands in the order `dapo --help` lists them.
COMMAND_GROUPS = ("show", "training", "models", "services", "sweeps", "tracking")
for _group in COMMAND_GROUPS:
    importlib.import_module(f"flows.commands.{_group}")


def _help_as_sentences(group: typer.Typer) -> None:
    """A command's line in ``--help`` is its docstring's first paragraph, and rich keeps that
    docstring's line breaks, which cut sentences mid-line: give each paragraph on one line (the
    terminal wraps it), in the command's list and in its own help (a paragraph that is a list
    keeps its lines)."""
    for info in group.registered_commands:
        doc = info.callback.__doc__ if info.callback else None
        if info.short_help is None and info.help is None and doc:
            paragraphs = [_one_line(p) for p in inspect.cleandoc(doc).split("\n\n")]
            info.short_help, info.help = paragraphs[0], "\n\n".join(paragraphs)
    for sub in group.registered_groups:
        _help_as_sentences(sub.typer_instance)


def _one_line(paragraph: str) -> str:
    lines = paragraph.splitlines()
    if any(line.lstrip().startswith(("- ", "* ")) or line.startswith(" ") for line in lines):
        return paragraph
    return " ".join(paragraph.split())


_help_as_sentences(app)

if __name__ == "__main__":
    from flows.signals import run_to_the_end

    run_to_the_end(app)
