"""Where stages compute: devices and dtypes (device), and torchrun data parallelism (distributed)."""
