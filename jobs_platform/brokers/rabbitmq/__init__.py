"""The RabbitMQ broker (``amqp://``, ``amqps://``): quorum queues, dead-lettering, poison."""
