"""topology layer of ccltune."""
