"""tpulaunch: validate, plan and launch TPUEstimator training from one YAML job file."""

__version__ = "0.1.0"
