"""Names to folders (vecmerge.yaml), base models, lineage, task vectors: what the inputs are."""
