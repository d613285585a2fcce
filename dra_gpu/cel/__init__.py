"""The Kubernetes DRA device-selector CEL environment (pure). Entry point: `dra_gpu.cel.environment`."""
