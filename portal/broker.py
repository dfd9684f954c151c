"""Removing a checkout's (or a test run's) Celery queue and cache keys from a shared Redis."""

from __future__ import annotations

import json

import redis
from celery import Celery


def queue_forget(app: Celery, queue: str) -> None:
    """Remove `queue` and every message on it from the app's broker.

    On Redis, a queue is a list per priority (kombu's `priority_steps`; a step sent urgent waits
    on its own list), kombu's binding sets for it, and the messages a killed worker held for it
    (kombu's unacked hash), which the next client to look would put back on the queue. On
    RabbitMQ it is one queue, deleted with its messages."""
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        if connection.transport.driver_type != "redis":
            channel.queue_delete(queue)
            return
        client = channel.client
        client.delete(
            queue,
            *(f"{queue}{channel.sep}{step}" for step in channel.priority_steps if step),
            channel.keyprefix_queue % queue,
            channel.keyprefix_binding_permanent % queue,
        )
        for tag, raw in client.hscan_iter(channel.unacked_key):
            try:
                routing_key = json.loads(raw)[2]
            except (ValueError, IndexError, TypeError):
                continue
            if routing_key == queue:
                client.hdel(channel.unacked_key, tag)
                client.zrem(channel.unacked_index_key, tag)


def queue_length(app: Celery, queue: str) -> int:
    """How many messages wait on `queue` (every priority); 0 for one the broker does not hold
    (a Redis queue is gone once empty)."""
    with app.connection_for_read() as connection:
        # One try: a broker out of reach raises within seconds, not after Celery's retries.
        connection.ensure_connection(max_retries=1, timeout=2)
        try:
            return connection.default_channel.queue_declare(queue, passive=True).message_count
        except connection.channel_errors:
            return 0


def cache_forget(cache_url: str, key_prefix: str) -> None:
    """Remove every key of the Django cache whose keys start with `key_prefix` from the Redis
    at `cache_url` (Django's keys are `prefix:version:key`); other keys stay."""
    client = redis.Redis.from_url(cache_url)
    try:
        keys = list(client.scan_iter(match=f"{key_prefix}:*", count=500))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()
