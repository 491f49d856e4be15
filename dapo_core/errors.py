"""Expected failures whose message tells the user what to do (the CLI prints them, no traceback)."""


class PipelineError(RuntimeError):
    """Base of the errors a user can act on (a cap reached, a run that cannot continue, ...)."""
