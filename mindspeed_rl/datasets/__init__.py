"""Data: chat templates, preprocessing handlers, indexed datasets, the prompt loader."""
