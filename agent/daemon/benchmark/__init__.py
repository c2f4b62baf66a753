"""The daemon's benchmark jobs: the parent side (jobs: the running job, with plan: a request
checked, launch: its process started, reporter: what it did said), the child process that runs
the cells (child), the pipe between them (process) and the journal that outlives both (journal)."""
