"""byteps-common: config, dtypes, reduction kernels and the framework-neutral worker core."""

INTERFACE_VERSION = (1, 0)
