"""The per-Mac side of mlx-fleet: local MLX benchmarks, thermal sensing and cooling."""
