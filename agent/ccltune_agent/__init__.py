"""ccltune node agent: probes GPUs, NVLink, PCIe and NICs and publishes a NodeTopology."""

__version__ = "0.1.0"
