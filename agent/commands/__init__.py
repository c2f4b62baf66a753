"""The agent's Typer commands, one module each; only agent/cli.py imports them, by name, when the
command runs."""
