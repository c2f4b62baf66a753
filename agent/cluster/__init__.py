"""What one rank of a job spanning several Macs runs, through MLX's own distributed backend
(ring or JACCL, chosen by the environment mlx.launch sets: MLX_RANK, MLX_HOSTFILE)."""
