"""What the agent and the coordinator share, by concept: a small kit at the top (shapes, tables,
safe_text, stats, bounds, clock, exit_codes), then cooling/, benchmark/, distributed/, wire/ and
reports/, all pure, and io/, the I/O helpers both sides need (README, Where things are)."""

__version__ = "0.1.0"
