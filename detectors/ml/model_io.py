"""Model files that do not execute code on load: skops archives plus a JSON sidecar.

``<name>.skops`` holds the fitted estimators (a dict kind -> estimator); ``<name>.json`` holds the
version, the feature spec and names the model was fitted on, the training metadata and metrics,
and the archive's sha256. Loading
1. reads the sidecar and refuses a format, feature-spec or feature-name mismatch with a message
   that says which and how to retrain;
2. checks the archive's sha256 against the sidecar;
3. asks skops for the archive's types and refuses any type outside :data:`TRUSTED_TYPES`, so a
   tampered archive that names an unexpected class is rejected before anything is built.
Never pickle or joblib: both run arbitrary code on load.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import skops.io as sio

from fleethealth.atomicfile import write_atomic
from fleethealth.errors import FleetHealthError

FORMAT_VERSION = 1

# Every type a fleethealth model archive may contain (scikit-learn's tree ensembles and numpy).
TRUSTED_TYPES: tuple[str, ...] = (
    "collections.OrderedDict",
    "numpy.dtype",
    "numpy.ndarray",
    "numpy.random.mtrand.RandomState",
    "numpy.random._mt19937.MT19937",
    "numpy.float64",
    "numpy.int64",
    "builtins.slice",
    "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
    "sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingClassifier",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn._loss.link.MultinomialLogit",
    "sklearn._loss.link.LogitLink",
    "sklearn._loss.loss.HalfBinomialLoss",
    "sklearn._loss.loss.HalfMultinomialLoss",
    "sklearn._loss.link.Interval",
    "sklearn.ensemble._iforest.IsolationForest",
    "sklearn.tree._classes.ExtraTreeRegressor",
    "sklearn.tree._tree.Tree",
)


class ModelError(FleetHealthError):
    """A model file is missing, mismatched, or not trusted; the message says which and what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_model(model_dir: Path, name: str, estimators: dict[str, Any], meta: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``<name>.skops`` and its sidecar ``<name>.json`` atomically; return both paths."""
    model_dir.mkdir(parents=True, exist_ok=True)
    archive = model_dir / f"{name}.skops"
    write_atomic(archive, sio.dumps(estimators, compression=zipfile.ZIP_DEFLATED, compresslevel=9))
    untrusted = [t for t in sio.get_untrusted_types(file=archive) if t not in TRUSTED_TYPES]
    if untrusted:  # a new sklearn may add internal types: fail at save, not at every load
        archive.unlink()
        raise ModelError(f"model {name} contains types outside TRUSTED_TYPES: {', '.join(untrusted)}")
    side = {**meta, "format_version": FORMAT_VERSION, "name": name, "archive": archive.name,
            "sha256": _sha256(archive)}
    sidecar = model_dir / f"{name}.json"
    write_atomic(sidecar, (json.dumps(side, indent=2, sort_keys=True) + "\n").encode())
    return archive, sidecar


def read_sidecar(model_dir: Path, name: str) -> dict[str, Any]:
    sidecar = model_dir / f"{name}.json"
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise ModelError(f"{sidecar}: no model sidecar; run `fleethealth train --out {model_dir}`") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{sidecar}:{exc.lineno}: sidecar is not valid JSON: {exc.msg}") from None
    if not isinstance(meta, dict):
        raise ModelError(f"{sidecar}: sidecar must be a JSON object")
    return meta


def load_model(model_dir: Path, name: str, feature_spec: int,
               features: dict[str, tuple[str, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load ``<name>`` from ``model_dir``; return (estimators by kind, sidecar). Raises ModelError."""
    meta = read_sidecar(model_dir, name)
    sidecar = model_dir / f"{name}.json"
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{sidecar}: model format {meta.get('format_version')!r}, this build reads "
                         f"{FORMAT_VERSION}; retrain with `fleethealth train`")
    if meta.get("feature_spec") != feature_spec:
        raise ModelError(f"{sidecar}: model was trained on feature spec {meta.get('feature_spec')!r}, this build "
                         f"extracts spec {feature_spec}; retrain with `fleethealth train`")
    got = meta.get("features") or {}
    for kind, names in features.items():
        if tuple(got.get(kind, ())) != tuple(names):
            theirs, ours = set(got.get(kind, ())), set(names)
            diff = sorted(theirs ^ ours)[:5] or ["(same names, different order)"]
            raise ModelError(f"{sidecar}: {kind} feature list differs from this build's "
                             f"({', '.join(diff)}); retrain with `fleethealth train`")
    archive_name = str(meta.get("archive", f"{name}.skops"))
    archive = model_dir / archive_name
    if Path(archive_name).name != archive_name or archive_name in ("", ".", "..") or \
            archive.resolve().parent != model_dir.resolve():
        raise ModelError(f"{sidecar}: archive {archive_name!r} must be a file name inside {model_dir} "
                         "(no path separators, no '..', no link out of the folder)")
    if not archive.exists():
        raise ModelError(f"{archive}: model archive missing (sidecar present)")
    if meta.get("sha256") != _sha256(archive):
        raise ModelError(f"{archive}: sha256 does not match the sidecar; the archive was changed after training")
    try:
        listed = sio.get_untrusted_types(file=archive)
    except Exception as exc:  # not a zip, a torn file: skops raises BadZipFile and others
        raise ModelError(f"{archive}: not a readable skops archive: {type(exc).__name__}: {exc}") from None
    untrusted = [t for t in listed if t not in TRUSTED_TYPES]
    if untrusted:
        raise ModelError(f"{archive}: refusing to load untrusted types: {', '.join(sorted(untrusted))}")
    try:
        est = sio.load(archive, trusted=list(TRUSTED_TYPES))
    except Exception as exc:  # skops raises several types for a corrupt archive
        raise ModelError(f"{archive}: cannot load model: {exc}") from None
    if not isinstance(est, dict) or set(est) - set(features):
        raise ModelError(f"{archive}: expected a dict of estimators keyed by {sorted(features)}")
    return est, meta
