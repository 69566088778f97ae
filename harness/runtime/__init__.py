"""The model runtime: the backend (cache, forward, attention), matmul paths, FLOPs, loading, kernels.

Only this package knows torch internals; decoders see :class:`harness.runtime.backend.Backend`.
"""
