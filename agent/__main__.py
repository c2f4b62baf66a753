"""`python -m agent`: what the service definitions run (no console script on PATH needed)."""

from agent.cli import main

main()
