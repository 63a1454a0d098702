"""The index service (ConsumeQueue and IndexFile). Not built yet."""
