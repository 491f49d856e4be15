"""The Model Registry: a policy that a run logged as an MLflow model (``Tracker.log_model``) put
under a registered name with an alias (``dapo register``), and a ``models:/`` URI read back as
the directory it refers to (``dapo evaluate --model models:/NAME@champion``,
``-S model.name_or_path=models:/NAME/3``).

The models are logged by reference (the files stay in the run directory; tag ``dapo.path``), so
a registered version names a directory on this machine's disk: one deleted since is refused in
one line, not loaded half.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dapo_core.errors import PipelineError
from tasks.tracking.store import (
    MODEL_PATH_TAG,
    POLICY_MODEL_TYPE,
    refuse_missing_store,
    tracking_uri,
)

MODELS_URI = "models:/"
DEFAULT_NAME, DEFAULT_ALIAS = "dapo-policy", "champion"
_RUN_ID = re.compile(r"[0-9a-f]{32}")
# MLflow's rules (mlflow.utils.validation): a name without '/' or ':'; an alias of word
# characters and dashes that a version's own alias (v3) or "latest" does not already mean
_ALIAS = re.compile(r"[\w-]{1,255}")
_VERSION_ALIAS = re.compile(r"[vV]\d+")


def check_names(name: str, alias: str, name_option: str = "--name") -> None:
    """One line for a registered-model name or an alias MLflow would refuse, before anything is
    registered (refused after the version is made, an alias left it without one)."""
    if not name.strip() or any(c in name for c in "/:'\""):
        raise PipelineError(
            f"{name_option} {name!r}: a registered model's name is not empty and has no '/', ':' "
            "or quote"
        )
    if not _ALIAS.fullmatch(alias) or _VERSION_ALIAS.fullmatch(alias) or alias.lower() == "latest":
        raise PipelineError(
            f"--alias {alias!r}: an alias is letters, digits, '_' and '-' (at most 255), and "
            "neither 'latest' nor a version's own name (v1, v2, ...)"
        )


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    alias: str
    model_id: str
    path: str
    new: bool = True  # False: the policy was a version of the model already (its alias moved)

    @property
    def uri(self) -> str:
        return f"{MODELS_URI}{self.name}@{self.alias}"


def is_model_uri(name: str) -> bool:
    return name.startswith(MODELS_URI)


def _client(uri: str | None):
    from mlflow import MlflowClient

    uri = uri or tracking_uri()
    try:
        refuse_missing_store(uri)
    except LookupError as e:
        raise PipelineError(str(e)) from None
    return MlflowClient(uri)


def logged_model_of(ref: str, uri: str | None = None) -> str:
    """The model id that ``ref`` names: a model id (``m-...``), a ``models:/`` URI, or a run id
    (the latest of the policies that run logged: the one at its highest step)."""
    client = _client(uri)
    if ref.startswith("m-"):
        return ref
    if is_model_uri(ref):
        return _model_id_of_uri(client, ref)
    if not _RUN_ID.fullmatch(ref):
        raise PipelineError(
            f"{ref!r} is not a run id, a model id (m-...) or a models:/ URI: copy one from "
            "`dapo ui` (a run's Overview, or the Models page)"
        )
    try:
        run = client.get_run(ref)
    except Exception:  # noqa: BLE001 - MLflow raises its own error for an unknown id
        raise PipelineError(f"no MLflow run {ref} in {client.tracking_uri}") from None
    models = client.search_logged_models(
        [run.info.experiment_id],
        filter_string=f"source_run_id = '{ref}' AND model_type = '{POLICY_MODEL_TYPE}'",
    )
    if not models:
        raise PipelineError(f"run {ref} logged no policy: {_no_policy_advice(run.data.tags)}")
    return max(models, key=lambda m: int(m.params.get("step", 0))).model_id


def _no_policy_advice(tags: dict[str, str]) -> str:
    """What to do about a run that logged no policy, by what made it."""
    if tags.get("dapo.flow") == "dpo" and tags.get("dpo.out_dir"):
        out = Path(tags["dpo.out_dir"])
        then = "logs it as a model, then register that evaluation's run"
        if out.exists():
            return f"its DPO policy is the directory {out}: `dapo evaluate --model {out}` {then}"
        rounds = out.parent  # an iterative DPO round's: <parent>/.<out>.rounds/round<r>
        if rounds.name.startswith(".") and rounds.name.endswith(".rounds"):
            final = rounds.parent / rounds.name[1 : -len(".rounds")]
            return (
                f"its policy was an iterative DPO round's ({out}), not kept once the rounds "
                f"ended; the last round's policy is {final}: `dapo evaluate --model {final}` {then}"
            )
        return f"its DPO policy was the directory {out}, which is no longer there"
    if tags.get("dapo.flow") == "reward_model":
        return "it trained a reward model, which scores responses: register a policy's run"
    return (
        "a training run logs one when it completes (finish it with `dapo train --resume "
        "RUN_DIR`), an evaluation when it evaluates a directory"
    )


def register(
    ref: str, name: str = DEFAULT_NAME, alias: str = DEFAULT_ALIAS, uri: str | None = None
) -> Registered:
    """A new version of registered model ``name`` made from the policy ``ref`` names, with
    ``alias`` moved to it (the registered model is created on first use). A policy that is a
    version of it already is not registered again: ``alias`` moves to that version."""
    from mlflow.exceptions import MlflowException

    check_names(name, alias)
    model_id = logged_model_of(ref, uri)
    client = _client(uri)
    try:
        model = client.get_logged_model(model_id)
    except MlflowException as e:
        raise PipelineError(
            f"no logged model {model_id} in {client.tracking_uri} ({e.message.splitlines()[0]}): "
            "copy its id from `dapo ui` (the Models page), or register a run id"
        ) from None
    path = _existing_path(model.tags.get(MODEL_PATH_TAG), model_id)

    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    import mlflow

    # MLflow looks a models:/ source up in the process's global store: make it this one
    mlflow.set_tracking_uri(client.tracking_uri)
    versions = client.search_model_versions(f"name='{name}'")
    source = f"{MODELS_URI}{model_id}"  # what each version made here records
    same = [v for v in versions if v.model_id in (model_id, None) and v.source == source]
    version = (
        same[0]
        if same
        else client.create_model_version(
            name, f"{MODELS_URI}{model_id}", run_id=model.source_run_id, model_id=model_id
        )
    )
    client.set_registered_model_alias(name, alias, version.version)
    return Registered(name, str(version.version), alias, model_id, path, new=not same)


def model_path(model_uri: str, uri: str | None = None) -> str:
    """The policy directory ``models:/NAME@ALIAS``, ``models:/NAME/VERSION`` or
    ``models:/m-ID`` refers to."""
    client = _client(uri)
    model_id = _model_id_of_uri(client, model_uri)
    return _existing_path(client.get_logged_model(model_id).tags.get(MODEL_PATH_TAG), model_uri)


def _model_id_of_uri(client, model_uri: str) -> str:
    from mlflow.exceptions import MlflowException

    rest = model_uri[len(MODELS_URI) :]
    try:
        if rest.startswith("m-"):
            return rest
        if "@" in rest:
            version = client.get_model_version_by_alias(*rest.split("@", 1))
        elif "/" in rest:
            version = client.get_model_version(*rest.split("/", 1))
        else:
            raise PipelineError(
                f"{model_uri}: name a version or an alias (models:/NAME/3, models:/NAME@champion)"
            )
    except MlflowException as e:
        raise PipelineError(
            f"{model_uri} is not in the Model Registry of {client.tracking_uri} "
            f"({e.message.splitlines()[0][:200]}): `dapo register RUN_ID` puts a run's policy "
            "there"
        ) from None
    return version.model_id or version.source[len(MODELS_URI) :]


def _existing_path(path: str | None, what: str) -> str:
    if not path:
        raise PipelineError(f"{what} is not a policy this project logged (no {MODEL_PATH_TAG} tag)")
    if not (Path(path) / "config.json").is_file():
        raise PipelineError(
            f"{what} refers to {path}, which holds no model any more (the run directory was "
            "moved or deleted): register another run's policy"
        )
    return path


PROMOTION_METRIC = "val/avg_at_k"  # the validation score the nightly promotion compares


@dataclass(frozen=True)
class Promotion:
    """What a promotion decided: the candidate's score, the champion's (None: no champion, or
    one whose run logged no score), and the new version when it was promoted."""

    score: float | None
    champion: float | None
    registered: Registered | None

    def describe(self, name: str, alias: str) -> str:
        if self.registered is not None:
            was = "no champion before" if self.champion is None else f"champion {self.champion:.4f}"
            return (
                f"promoted to {self.registered.uri} (version {self.registered.version}): "
                f"{PROMOTION_METRIC} {self.score:.4f}, {was}"
            )
        if self.score is None:
            return (
                f"not promoted: the run logged no {PROMOTION_METRIC} to compare (set "
                "eval.every_n_steps > 0)"
            )
        if self.champion is None:
            return (
                f"not promoted: {MODELS_URI}{name}@{alias} has no {PROMOTION_METRIC} to beat (it "
                "was registered by hand, or its run is gone): promote with `dapo register`"
            )
        return (
            f"not promoted: {PROMOTION_METRIC} {self.score:.4f} does not beat "
            f"{MODELS_URI}{name}@{alias}'s {self.champion:.4f}"
        )


def promote_if_better(
    run_id: str, name: str = DEFAULT_NAME, alias: str = DEFAULT_ALIAS, uri: str | None = None
) -> Promotion:
    """The rule the nightly schedule promotes by: run ``run_id``'s policy becomes a new version
    of ``name`` with ``alias`` when its last validation score (``PROMOTION_METRIC``) is higher
    than the last one of the run that logged the current ``alias`` version, or when there is no
    such version yet. A run without that score is not promoted, nor is any run over a champion
    without one (registered by hand: a person's choice is not overruled by a rule)."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    score = _last_value(client, run_id)
    try:
        current = client.get_model_version_by_alias(name, alias)
    except MlflowException as e:  # no such model or alias yet: no champion to beat
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        current = None
    champion = _last_value(client, current.run_id) if current and current.run_id else None
    if current is None:
        better = score is not None
    else:
        better = score is not None and champion is not None and score > champion
    registered = register(run_id, name, alias, uri) if better else None
    return Promotion(score, champion, registered)


def _last_value(client, run_id: str) -> float | None:
    """The run's last ``PROMOTION_METRIC``; None without one, or when the run is gone."""
    from mlflow.exceptions import MlflowException

    try:
        history = client.get_metric_history(run_id, PROMOTION_METRIC)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None
    return max(history, key=lambda m: m.step).value if history else None
