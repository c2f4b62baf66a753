"""The daemon's benchmark jobs: the parent side (jobs), the child process that runs the cells
(child), the pipe between them (process) and the journal that outlives both (journal)."""
