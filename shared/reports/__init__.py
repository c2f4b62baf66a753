"""What a reader sees: benchmark and sustained-run reports in every format, doctor tables and
verdicts, and a distributed group's cells merged from its ranks' records."""
