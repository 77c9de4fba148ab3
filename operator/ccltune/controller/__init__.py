"""controller layer of ccltune."""
