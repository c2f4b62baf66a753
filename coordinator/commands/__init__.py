"""The coordinator's Typer commands, one module each (hosts: the host options they share and
the per-host request skeleton); coordinator/cli.py names them and imports each when it runs."""
