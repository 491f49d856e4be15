"""The last words a tracker leaves with the reaper (``tasks.lifetime``): should its process be
killed outright, the reaper runs ``python -c END_ORPHAN URI RUN_ID OWNER``, which ends the run
KILLED unless another process has taken it over since. It imports MLflow and nothing else of
ours (no torch, no config): the run of a killed command ends as soon as the client can write.
"""

from __future__ import annotations

OWNER_TAG = "dapo.owner"  # the process holding a run open: "pid:start time" (tasks.lifetime)
END_ORPHAN = (
    "import sys; from tasks.tracking.orphans import end_orphaned_run as e; e(*sys.argv[1:])"
)


def end_orphaned_run(uri: str, run_id: str, owner: str) -> bool:
    """End ``run_id`` KILLED if it is still RUNNING and still held by ``owner`` (its process
    was killed outright and nobody resumed it since): the last words a tracker leaves with the
    reaper, run as ``python -c END_ORPHAN URI RUN_ID OWNER``. True when it was ended."""
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        run = client.get_run(run_id)
        if run.info.status != "RUNNING" or run.data.tags.get(OWNER_TAG) != owner:
            return False
        client.set_terminated(run_id, "KILLED")
    except Exception:  # noqa: BLE001 - a store that is away: nothing more to do
        return False
    return True
