"""Launchers: admitted allocations as Kubernetes objects and their submission; local processes."""
