"""Deployment tests: Docker, Kubernetes manifests, Prometheus and network namespaces, with real tools."""
