"""Cooling as data: the policy and its one decision function, the calibrated thresholds, the gang
rule for a distributed job, the cool start, a supervised job's accounting, the names of thermal and
power sources and how a temperature is drawn. Imports no other concept room of shared/."""
