"""What the agent and the coordinator share: pure modules here (protocol, matrix, policy,
telemetry, results, stats, reports), the I/O helpers both need in shared.io."""

__version__ = "0.1.0"
