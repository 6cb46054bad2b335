"""Shared test helpers: tiny corpora and projects, the import graph, the browser, the served model."""
