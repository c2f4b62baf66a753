"""A benchmark as data: the matrix and its cells, a cell's record, verdict, energy, reboots and
sustained windows, the faults injected to see every verdict, and a run's progress in words.
Never imports shared.distributed (a group's cells are merged in shared.reports)."""
