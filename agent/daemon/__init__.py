"""`agent serve`: the daemon's loop, its sockets and ZAP handler, the request handlers, the
telemetry hub and its history on disk; benchmark/ holds the benchmark job's parent side, child
process and journal."""
