"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once (torch-free)."""
