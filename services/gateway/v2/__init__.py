"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``) on the gateway, beside
``rocketstore.v1``: what RocketMQ's proxy does for each call, over the gateway's processors."""
