"""Expected failures whose message tells the user what to do (the CLI prints them, no traceback)."""


class PipelineError(RuntimeError):
    """Base of the errors a user can act on (a cap reached, a run that cannot continue, ...)."""


class TrainingInterrupted(PipelineError):
    """Ctrl-C or SIGTERM stopped a run; the message says where it stands and how to continue."""


class TrainingStopped(PipelineError):
    """The run cannot go on (e.g. too many non-finite updates in a row); the message says why."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of ``error``'s message (its class name when it has none), for a one-line
    report that quotes what a library said."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]
