"""The store's primitives and on-disk formats: records, mapped files, the checkpoint, statuses."""
