"""The broker around the layers (Kafka's ``BrokerServer`` and ``BrokerMetadataPublisher``): what
applies metadata changes to the logs, replicas, tiering and coordinators. It sits above
``server``, ``replication``, ``tiered`` and ``coordinator``; only ``cli`` imports it."""
