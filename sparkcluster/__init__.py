"""sparkcluster: bring two DGX Sparks from bare to serving a model with tensor parallelism."""

__version__ = "0.1.0"
