"""The lab's temperatures live: the monitor, one link per host with its cursor, the dashboard and
its gang rows, supervised jobs' history, and the telemetry store with its statistics. Never
imports coordinator.runs."""
