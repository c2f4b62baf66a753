"""A job across several Macs: the group a benchmark rank belongs to, a rank's environment as
mlx.launch writes it, the rank.* wire shapes and what netbench measures. Never imports
shared.benchmark."""
