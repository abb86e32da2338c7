"""The sidecar: samples the machine and the job each interval and writes the run directory."""
