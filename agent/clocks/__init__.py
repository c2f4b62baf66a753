"""The clocks: how fast the GPU and the CPU clusters ran (shared.cooling.clocks.ClockReading),
from IOReport and the pmgr DVFS tables on a Mac, cpufreq on Linux, or a thermal source's own."""
