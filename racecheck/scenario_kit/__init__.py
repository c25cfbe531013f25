"""Building blocks of the catalogue's suites: the world and runtime fixtures, the training and FSDP parity checks."""
