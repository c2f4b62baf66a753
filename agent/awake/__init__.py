"""Whether the machine stays awake under a measurement, and whether it slept or rebooted: the
power assertion held around jobs, the pair of clocks that tell a sleep, the boot time, the power
state (Low Power Mode, AC or battery) and the panic reports a reboot leaves."""
