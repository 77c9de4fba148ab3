"""ccltune: synthesize and tune collective communication for the cluster a job runs on."""

__version__ = "0.1.0"
