"""End-to-end suite of dra-gpu: runs against a real Kubernetes cluster (local binaries or kind)."""
