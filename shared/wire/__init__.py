"""What crosses the wire between agent and coordinator (docs/protocol.md): the envelope and its
checks, what an agent may send, telemetry samples and events. Imports no report."""
