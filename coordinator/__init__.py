"""The operator's side of mlx-fleet: drives many agents and aggregates their results. In rooms by
concept: hosts/, runs/, telemetry/, reports/, and commands/ (the only room that speaks Typer),
under cli.py (README, Where things are)."""
