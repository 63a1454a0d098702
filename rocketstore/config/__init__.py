"""The configuration: the settings table, its generated views, and config files on disk."""
