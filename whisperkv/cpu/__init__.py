"""The CPU backend: the C kernels, their build and loading, and the fast steps (docs/architecture.md)."""
