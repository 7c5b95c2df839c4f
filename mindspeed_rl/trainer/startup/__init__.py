"""Everything before the first worker starts: the config's names against their registries, the precision settled with
the device, the batch plan and rank layout, the paths and environment, and the pre-flight checks."""
