"""The schedule service: RocketMQ's ScheduleMessageService (delay levels) as its own process."""
