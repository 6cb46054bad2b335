"""attnlab: attention models (D2L chapter 11) in a reproducible DVC + Hydra + MLflow pipeline."""

__version__ = "0.1.0"
