"""Start and stop the Kafka-compatible brokers Sibylla runs on."""
