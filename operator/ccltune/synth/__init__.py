"""synth layer of ccltune."""
