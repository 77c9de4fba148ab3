"""publish layer of ccltune."""
