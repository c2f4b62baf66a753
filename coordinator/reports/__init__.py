"""What is drawn from stored runs and telemetry: compare, netbench's tables, and every plot (all
of matplotlib is here). Imports no run."""
