"""The grading model as plain arrays (``grader.npz``, read with ``allow_pickle=False``), not a pickle:
data/graded travels through DVC remotes, and unpickling a shared file runs whatever code it holds.

What is kept is exactly what ``predict_proba`` of ``grading.make_scorer``'s pipeline needs: the PCA
(mean, components), the standardisation (mean, scale), and the classifier (logistic regression's
coefficients and intercepts, or k-NN's fitted points, labels and k). ``grader_proba`` recomputes the
probabilities with numpy, equal to scikit-learn's to float rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline

FORMAT = 1
GRADER_FILE = "grader.npz"  # in data/graded, beside scores.csv
KINDS = ("logreg", "knn")


def grader_arrays(scorer: Pipeline) -> dict[str, np.ndarray]:
    """A fitted ``make_scorer`` pipeline as named arrays."""
    pca, scale, model = scorer.named_steps["pca"], scorer.named_steps["scale"], scorer.named_steps["model"]
    if getattr(pca, "whiten", False):
        raise ValueError("grader_arrays: a whitened PCA is not supported")
    out = {"format": np.array(FORMAT), "pca_mean": pca.mean_, "pca_components": pca.components_,
           "scale_mean": scale.mean_, "scale_scale": scale.scale_, "classes": model.classes_}
    if isinstance(model, LogisticRegression):
        out.update(kind=np.array("logreg"), coef=model.coef_, intercept=model.intercept_)
    elif isinstance(model, KNeighborsClassifier):
        if model.weights != "uniform" or model.effective_metric_ != "euclidean":
            raise ValueError("grader_arrays: only uniform-weight euclidean k-NN is supported")
        out.update(kind=np.array("knn"), fit_x=np.asarray(model._fit_X), fit_y=np.asarray(model._y),
                   k=np.array(model.n_neighbors))
    else:
        raise ValueError(f"grader_arrays: unsupported classifier {type(model).__name__}")
    return out


def save_grader(path: Path, scorer: Pipeline) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **grader_arrays(scorer))


def load_grader(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``save_grader``; a clear ValueError naming ``path`` if they are not a grader."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a grader file ({exc})") from None
    needed = {"format", "kind", "pca_mean", "pca_components", "scale_mean", "scale_scale", "classes"}
    missing = sorted(needed - set(arrays))
    if missing or int(arrays["format"]) != FORMAT or str(arrays["kind"]) not in KINDS:
        raise ValueError(f"{path}: not a grader file of format {FORMAT} (missing {missing or 'nothing'}, "
                         f"kind {arrays.get('kind')!r})")
    return arrays


def _features(arrays: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    x = images.reshape(len(images), -1).astype(np.float32) / 255.0  # as grading._scale
    z = (x - arrays["pca_mean"]) @ arrays["pca_components"].T
    return (z - arrays["scale_mean"]) / arrays["scale_scale"]  # (N, P)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _knn_proba(arrays: dict[str, np.ndarray], z: np.ndarray, chunk: int = 512) -> np.ndarray:
    fit_x, fit_y, k = arrays["fit_x"], arrays["fit_y"], int(arrays["k"])
    n_classes = len(arrays["classes"])
    norms = (fit_x**2).sum(axis=1)  # (M,)
    out = np.zeros((len(z), n_classes))
    for s in range(0, len(z), chunk):
        d = norms[None, :] - 2.0 * z[s:s + chunk] @ fit_x.T  # (b, M): squared distance minus |z|^2
        near = np.argpartition(d, k - 1, axis=1)[:, :k]  # (b, k)
        for c in range(n_classes):
            out[s:s + chunk, c] = (fit_y[near] == c).sum(axis=1) / k
    return out


def grader_proba(arrays: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """Class probabilities (N, len(classes)) of uint8 images (N, C, H, W), columns in ``classes`` order."""
    z = _features(arrays, images)
    if str(arrays["kind"]) == "knn":
        return _knn_proba(arrays, z)
    logits = z @ arrays["coef"].T + arrays["intercept"]  # (N, K) or (N, 1) for two classes
    if logits.shape[1] == 1:
        p = 1.0 / (1.0 + np.exp(-logits[:, 0]))
        return np.stack([1.0 - p, p], axis=1)
    return _softmax(logits)


def levels_of(arrays: dict[str, np.ndarray], images: np.ndarray, labels: np.ndarray,
              train_scores: Path) -> np.ndarray:
    """Difficulty level of labelled images (N,): the grader's score ``1 - p(true class)``, binned at the
    edges of the training levels (grade's ``scores.csv``: the highest score of each level)."""
    import pandas as pd

    proba = np.zeros((len(labels), max(int(labels.max()) + 1, int(arrays["classes"].max()) + 1)))
    proba[:, arrays["classes"]] = grader_proba(arrays, images)
    scores = 1.0 - proba[np.arange(len(labels)), labels]
    train = pd.read_csv(train_scores)
    edges = train.groupby("level")["score"].max().sort_index().to_numpy()[:-1]
    return np.searchsorted(edges, scores, side="left") + 1
