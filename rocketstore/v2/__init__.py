"""Generated gRPC stubs of RocketMQ 5's protocol (proto package apache.rocketmq.v2); see protos/apache/rocketmq/v2/."""
