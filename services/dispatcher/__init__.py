"""The dispatcher (RocketMQ's ReputMessageService as a process). Not built yet."""
