"""The CommitLog service: owns every CommitLog file, every append and every flush."""
