"""The local stack for real: Azurite through the Azure SDK, start/stop semantics, PostgreSQL."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from azure.storage.queue import QueueClient

from shared.localstack import AzuriteStack, StackError, port_open


def test_session_azurite_serves_queues_through_the_sdk(azurite: str) -> None:
    queue = QueueClient.from_connection_string(azurite, f"stack-{uuid.uuid4().hex[:8]}")
    queue.create_queue()
    try:
        queue.send_message("hello")
        [message] = list(queue.receive_messages(max_messages=32, visibility_timeout=5))
        assert message.content == "hello"
        queue.delete_message(message)
        assert queue.get_queue_properties().approximate_message_count == 0
    finally:
        queue.delete_queue()


def test_start_is_idempotent_and_stop_closes_the_ports(tmp_path: Path) -> None:
    stack = AzuriteStack(home=tmp_path, persist=False)
    try:
        connection = stack.start()
        state = json.loads((tmp_path / "azurite.json").read_text())
        assert state["connection_string"] == connection
        assert f"QueueEndpoint=http://127.0.0.1:{state['queue_port']}/devstoreaccount1" in connection

        again = AzuriteStack(home=tmp_path, persist=False)
        assert again.start() == connection
        assert json.loads((tmp_path / "azurite.json").read_text())["pid"] == state["pid"]
        assert again.running() and again.connection_string() == connection

        QueueClient.from_connection_string(connection, "in-memory").create_queue()
    finally:
        stack.stop()
    assert not port_open("127.0.0.1", state["blob_port"])
    assert not port_open("127.0.0.1", state["queue_port"])
    assert not (tmp_path / "azurite.json").exists()
    assert not stack.running() and stack.connection_string() is None
    stack.stop()
    AzuriteStack(home=tmp_path).stop()


def test_persistent_data_survives_a_restart_on_fixed_ports(tmp_path: Path) -> None:
    stack = AzuriteStack(home=tmp_path, persist=True)
    try:
        connection = stack.start()
        state = json.loads((tmp_path / "azurite.json").read_text())
        QueueClient.from_connection_string(connection, "kept").create_queue()
        stack.stop()
        stack = AzuriteStack(home=tmp_path, blob_port=state["blob_port"], queue_port=state["queue_port"])
        assert stack.start() == connection
        assert QueueClient.from_connection_string(connection, "kept").get_queue_properties().name == "kept"
    finally:
        stack.stop()  # the one that started it last: it reaps its process
    assert (tmp_path / "azurite").is_dir()


def test_a_taken_port_fails_start_with_the_log_file_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stack = AzuriteStack(home=tmp_path, queue_port=taken.getsockname()[1])
        with pytest.raises(StackError, match=r"EADDRINUSE.*azurite\.log"):
            stack.start()
    assert not stack.running() and not (tmp_path / "azurite.json").exists()


@pytest.mark.postgres
def test_postgres_server_answers_through_sqlalchemy(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("select 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_sql_url_is_a_fresh_database(sql_url: str) -> None:
    engine = sa.create_engine(sql_url)
    try:
        with engine.begin() as conn:
            assert sa.inspect(conn).get_table_names() == []
            conn.execute(sa.text("create table t (x integer)"))
            conn.execute(sa.text("insert into t values (1)"))
            assert conn.execute(sa.text("select count(*) from t")).scalar_one() == 1
    finally:
        engine.dispose()
