"""The registered model's code: MLflow's models-from-code entry point for the cascade pyfunc model.

``register`` hands MLflow this file's path as ``python_model`` (:func:`pipeline.registry.mlflow_models.
log_cascade_model`); MLflow copies it into the model and runs it whenever the model is loaded or served,
so a registered version holds no pickled object: loading runs this file, the ``pipeline`` package the
model carries (its ``code_paths``) and ``torch.load(weights_only=True)`` on the cascade's weights.
docs/DESIGN.md "Serving" ("A registered model that holds no pickle").

The pipeline never imports this module (it would only set MLflow's model global)."""

import mlflow.models

from pipeline.registry.mlflow_models import CascadeModel

mlflow.models.set_model(CascadeModel())
