"""Plan -> files and ConfigMaps. Pure functions: callers do the writing."""
