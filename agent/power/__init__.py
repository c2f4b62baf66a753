"""Power and energy on every Mac (and Linux node): power sources, readings and the EnergyMeter
(docs/energy.md). `open_power_source(name)` opens a source by name."""
