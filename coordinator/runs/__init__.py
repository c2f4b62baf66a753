"""Benchmark and netbench runs: one host's driver and its events, a distributed group's driver,
the fleet run itself, the embedded local agent, and the run store with its reports. Never
imports coordinator.telemetry."""
