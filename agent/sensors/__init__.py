"""What thermal/ and power/ both stand on: the Source protocol, macOS library loading, the
AppleSMC connection, tool-process streaming, sysfs, recorded replays and the CPU load model.
Imports neither of them."""
