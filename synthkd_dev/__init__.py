"""Tools for developing and testing synthkd, run from the repository root and never shipped in the wheel:
a local cluster, the sensor-tick emulator, the partition-scale scenario and the sample-data generator."""
