"""Client connections to Kafka brokers over sockets (blocking and asyncio)."""
