"""The module ``faust -A stream_eval.stream.entry worker`` loads: the one place a faust.App is built on import.

``stream-eval worker`` is the usual way to start the worker; this module is for faust's own command line.
Settings come from the environment: ``STREAM_EVAL_BROKER`` (default ``kafka://localhost:9092``),
``STREAM_EVAL_TOPIC_PREFIX``, ``STREAM_EVAL_GROUP``, the ``STREAM_EVAL_*`` evaluation and Kafka security settings
(and both tables of the ``STREAM_EVAL_CONFIG`` file).
"""

from __future__ import annotations

import os

from stream_eval.config import load_config
from stream_eval.stream.app import create_app
from stream_eval.stream.kafka import DEFAULT_BROKER, kafka_security, parse_brokers
from stream_eval.stream.settings import WorkerSettings

settings = WorkerSettings(
    brokers=parse_brokers(os.environ.get("STREAM_EVAL_BROKER", DEFAULT_BROKER)),
    prefix=os.environ.get("STREAM_EVAL_TOPIC_PREFIX", ""),
    group=os.environ.get("STREAM_EVAL_GROUP", "stream-eval"),
    security=kafka_security(None, os.environ.get("STREAM_EVAL_CONFIG")),
)
app, worker = create_app(settings, load_config(os.environ.get("STREAM_EVAL_CONFIG")))
