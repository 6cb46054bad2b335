"""attnlab: attention models (D2L chapter 11) in a reproducible DVC + Hydra + MLflow pipeline."""

from attnlab.config import register_resolvers

__version__ = "0.1.0"

register_resolvers()  # conf/config.yaml uses ${dvc_project:...}
