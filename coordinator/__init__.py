"""The operator's side of mlx-fleet: drives many agents and aggregates their results."""
