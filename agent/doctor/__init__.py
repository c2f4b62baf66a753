"""`agent doctor`'s checks, for the command and for the daemon's `doctor` request alike."""
