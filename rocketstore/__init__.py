"""rocketstore: a durable message store with Apache RocketMQ's storage model, as gRPC services."""
