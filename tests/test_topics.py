"""The worker's topics carry the settings a production cluster needs (docs/operations.md), and topics that exist with
settings it cannot work with stop it at start, saying which and why. On both brokers: Tansu reports the settings a
topic was created with, Apache Kafka every setting (its defaults included)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from stream_eval.cli import main
from stream_eval.config import ConfigError
from stream_eval.stream.broker import free_port
from stream_eval.stream.kafka import CHECKED_SETTINGS, TopicSettingsError, ensure_topics, topic_mismatches
from stream_eval.stream.settings import WorkerSettings
from stream_eval.stream.worker import prepare_topics


async def _describe(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    """``{topic: {setting: value}}`` from DescribeConfigs, and ``{topic: {"replicas": n}}`` merged in."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found: dict[str, dict[str, str]] = {name: {} for name in names}
        for answer in await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names]):
            for resource in answer.resources:
                found[resource[3]].update({entry[0]: entry[1] for entry in resource[4]})
        for topic in await admin.describe_topics(names):
            found[topic["topic"]]["partitions"] = str(len(topic["partitions"]))
        return found
    finally:
        await admin.close()


def test_each_topic_is_created_with_the_settings_it_needs(broker: str) -> None:
    settings = WorkerSettings([broker], prefix="topics-new.", group="g", partitions=3)
    asyncio.run(prepare_topics(settings, 30))
    found = asyncio.run(_describe(broker, list(settings.topic_configs())))
    kept = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", "min.insync.replicas": "1",
            "segment.ms": "3600000"}  # (hourly segments: what the worker trims leaves the disk within the hour)
    for name in (settings.checkpoint_topic, settings.regroup_topic, settings.snapshot_topic):
        assert {k: found[name][k] for k in kept} == kept, name  # logs re-read from an offset: never deleted
    assert found[settings.regroup_checkpoint_topic]["cleanup.policy"] == "compact"  # the latest record alone
    names = settings.topics
    for name in (*names.inputs, names.request_metrics, names.dead_letters, settings.control_topic):
        assert found[name]["cleanup.policy"] == "delete", name  # never compacted (dead letters have no key)
    assert {name: found[name]["partitions"] for name in found} == {name: "3" for name in found}  # stage: as inputs
    asyncio.run(prepare_topics(settings, 30))  # a second start finds them fit


def test_existing_topics_with_settings_that_do_not_fit_stop_the_worker(broker: str) -> None:
    """Made by hand (or by an older version) with the broker's defaults, a 7-day retention, a delete policy on the
    compacted topic: every misfit is named at once, with the setting it needs."""
    settings = WorkerSettings([broker], prefix="topics-old.", group="g", partitions=2)
    week = {"retention.ms": str(7 * 86_400_000)}
    asyncio.run(ensure_topics([broker], [settings.regroup_topic], 1, configs={settings.regroup_topic: week}))
    asyncio.run(ensure_topics([broker], [settings.regroup_checkpoint_topic], 1,
                              configs={settings.regroup_checkpoint_topic: {"cleanup.policy": "delete"}}))
    asyncio.run(ensure_topics([broker], [settings.topics.dead_letters], 2,
                              configs={settings.topics.dead_letters: {"cleanup.policy": "compact"}}))
    with pytest.raises(TopicSettingsError) as raised:
        asyncio.run(prepare_topics(settings, 30))
    message = str(raised.value)
    assert f"{settings.regroup_topic}: retention.ms is '604800000', needs '-1'" in message
    assert f"{settings.regroup_checkpoint_topic}: cleanup.policy is 'delete', needs 'compact'" in message
    assert f"{settings.topics.dead_letters}: cleanup.policy is 'compact', needs 'delete'" in message
    assert "docs/operations.md" in message


def test_more_replicas_than_the_topics_have_is_an_error(broker: str) -> None:
    settings = WorkerSettings([broker], prefix="topics-rf.", group="g", partitions=1)
    asyncio.run(prepare_topics(settings, 30))
    stricter = WorkerSettings([broker], prefix="topics-rf.", group="g", partitions=1, replication_factor=3,
                              min_insync_replicas=2)
    with pytest.raises(TopicSettingsError) as raised:
        asyncio.run(prepare_topics(stricter, 30))
    message = str(raised.value)
    assert f"{settings.regroup_topic}: replication factor 1, needs at least 3" in message
    assert f"{settings.regroup_topic}: min.insync.replicas is '1', needs at least 2" in message


def test_the_worker_command_says_which_topic_does_not_fit_and_exits_2(broker: str) -> None:
    settings = WorkerSettings([broker], prefix="topics-cli.", group="g")
    asyncio.run(ensure_topics([broker], [settings.checkpoint_topic], 4,
                              configs={settings.checkpoint_topic: {"retention.ms": "3600000"}}))
    done = subprocess.run([sys.executable, "-m", "stream_eval.cli", "worker", "--broker", f"kafka://{broker}",
                           "--topic-prefix", "topics-cli.", "--group", "g", "--metrics-port", str(free_port()),
                           "--metrics-host", "127.0.0.1"], capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 2, err[-3000:]
    assert f"{settings.checkpoint_topic}: retention.ms is '3600000', needs '-1'" in err
    assert "Traceback" not in err


def test_min_insync_replicas_above_the_replication_factor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--replication-factor", "2", "--min-insync-replicas", "3"]) == 2
    assert "min_insync_replicas (3) must be from 1 to the replication factor (2)" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        WorkerSettings(["localhost:9092"], min_insync_replicas=0)


@pytest.mark.parametrize(("found", "wrong"), [
    ({}, []),  # a broker that reports nothing (Tansu reports only what a topic was created with): not checked
    ({"cleanup.policy": "compact,delete"}, ["t: cleanup.policy is 'compact,delete', needs 'delete'"]),
    ({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", "min.insync.replicas": "2"}, []),
    ({"retention.bytes": "1000000"}, ["t: retention.bytes is '1000000', needs '-1'"]),
])
def test_topic_mismatches(found: dict[str, Any], wrong: list[str]) -> None:
    wanted = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1", "min.insync.replicas": "1"}
    assert set(wanted) == set(CHECKED_SETTINGS)
    assert topic_mismatches("t", wanted, found) == wrong


def test_input_topics_with_different_partition_counts_stop_the_worker(broker: str) -> None:
    """The join reads partition p of the rankings with partition p of the feedback: with 4 and 2 partitions half
    the feedback was orphaned, silently. Now that stops the worker at start; and a rankings topic that exists alone
    (auto-created by a producer, say) gives the feedback topic the worker creates its own count, not --partitions."""
    odd = WorkerSettings([broker], prefix="topics-odd.", group="g", partitions=4)
    asyncio.run(ensure_topics([broker], [odd.topics.rankings], 4))
    asyncio.run(ensure_topics([broker], [odd.topics.feedback], 2))
    with pytest.raises(TopicSettingsError) as raised:
        asyncio.run(prepare_topics(odd, 30))
    assert "topics-odd.rankings (4 partitions) and topics-odd.feedback (2 partitions)" in str(raised.value)
    alone = WorkerSettings([broker], prefix="topics-alone.", group="g", partitions=4)
    asyncio.run(ensure_topics([broker], [alone.topics.rankings], 1))
    assert asyncio.run(prepare_topics(alone, 30)) == (1, 1)
    found = asyncio.run(_describe(broker, [alone.topics.feedback]))
    assert found[alone.topics.feedback]["partitions"] == "1"


def test_the_topics_the_worker_creates_have_as_many_partitions_as_existing_inputs(broker: str) -> None:
    """Input topics made with 6 partitions (by ``produce --partitions 6``) and a worker at its default
    ``--partitions`` (4): its checkpoints were made with 4, and the worker of partitions 4 and 5 waited for
    partitions that do not exist, as if the broker were down. A checkpoint topic with fewer partitions than the
    inputs stops the worker at start."""
    wide = WorkerSettings([broker], prefix="topics-wide.", group="g", partitions=4)
    asyncio.run(ensure_topics([broker], [wide.topics.rankings, wide.topics.feedback], 6))
    assert asyncio.run(prepare_topics(wide, 30)) == (6, 6)
    found = asyncio.run(_describe(broker, list(wide.topic_configs())))
    assert {name: found[name]["partitions"] for name in found} == {name: "6" for name in found}
    narrow = WorkerSettings([broker], prefix="topics-narrow.", group="g", partitions=4)
    asyncio.run(ensure_topics([broker], [narrow.checkpoint_topic], 2))
    with pytest.raises(TopicSettingsError) as raised:
        asyncio.run(prepare_topics(narrow, 30))
    assert "topics-narrow.g.checkpoints has 2 partitions and the input topics 4" in str(raised.value)


def test_produce_gives_a_missing_input_topic_the_count_of_the_existing_one(broker: str) -> None:
    """``produce --partitions 4`` beside a feedback topic of 2 partitions made the rankings topic with 4, and the
    worker then refused the pair: produce now takes the existing topic's count, and refuses a pair that differs."""
    from stream_eval.stream.kafka import topics
    from stream_eval.stream.produce import send_lines

    names = topics("produce-pair.")
    asyncio.run(ensure_topics([broker], [names.feedback], 2))
    line = b'{"type": "ranking", "request_id": "r1", "ts": 1767225600, "items": ["a"]}\n'
    asyncio.run(send_lines([line], broker, names, speed=None, flush=False, partitions=4))
    found = asyncio.run(_describe(broker, [names.rankings, names.judgments]))
    assert found[names.rankings]["partitions"] == found[names.judgments]["partitions"] == "2"
    odd = topics("produce-odd.")
    asyncio.run(ensure_topics([broker], [odd.rankings], 4))
    asyncio.run(ensure_topics([broker], [odd.feedback], 2))
    with pytest.raises(TopicSettingsError, match="must have the same partition count"):
        asyncio.run(send_lines([line], broker, odd, speed=None, flush=False, partitions=4))


def test_stage_partitions_on_a_group_whose_regroup_log_exists_are_said_to_change_nothing(
        broker: str, caplog: pytest.LogCaptureFixture) -> None:
    """``--stage-partitions 8`` on a group whose regroup log has 4 was left out without a word."""
    settings = WorkerSettings([broker], prefix="topics-stages.", group="g", partitions=2, stage_partitions=2)
    assert asyncio.run(prepare_topics(settings, 30)) == (2, 2)
    with caplog.at_level("WARNING", logger="stream_eval.worker"):
        asyncio.run(prepare_topics(settings, 30))
    # (the same count: nothing to say; a client another test left to the garbage collector may log here)
    assert not [record for record in caplog.records if record.name.startswith("stream_eval")]
    more = WorkerSettings([broker], prefix="topics-stages.", group="g", partitions=2, stage_partitions=4)
    with caplog.at_level("WARNING", logger="stream_eval.worker"):
        assert asyncio.run(prepare_topics(more, 30)) == (2, 2)
    assert "--stage-partitions 4: the regroup log topics-stages.g.regroup exists with 2 partitions" in caplog.text
