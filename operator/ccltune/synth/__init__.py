"""synth layer of ccltune."""

# Work units: transfers assembled or simulated (a schedule of T transfers simulated once costs
# T, whatever engine runs it). h800-rail-512 AllGather at 1K:1G spent 34M, h800-rail-64 1.8M
# (docs/synthesis-scale.md): the default leaves ~60x room above the presets measured. Here, not
# in engine.py, so that `ccltune synthesize --help` shows it without importing the engine.
DEFAULT_WORK_BUDGET = 2_000_000_000
