"""The ``dapo`` commands, by group; ``flows.cli`` registers them all on one app."""
