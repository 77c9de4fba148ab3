"""tune layer of ccltune."""
