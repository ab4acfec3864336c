"""The release version, in a leaf module so that code recording it imports nothing else."""

__version__ = "0.1.0"
