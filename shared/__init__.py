"""Code shared by the agent and the coordinator: matrix spec, results, reports, paths."""

__version__ = "0.1.0"
