"""Master/slave replication of the CommitLog. Not built yet."""
