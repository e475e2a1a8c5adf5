"""/clients and `top` say what they leave out (topics past the cap) and print what clients send harmlessly."""

from __future__ import annotations

from typing import Any

from proxy.live import parse_metrics, render
from recording.terminal_text import printable
from proxy.metrics import MAX_TOPICS_MORE, MAX_TOPICS_PER_CLIENT, LiveStats


def _row(conn: str, topics: list[str], client_id: str = "app", software: str = "kafka-python") -> dict[str, Any]:
    return {"proxy_id": "p1", "conn_id": conn, "api_key": 1, "api_name": "Fetch", "api_version": 12,
            "client_id": client_id, "client_addr": "10.0.0.9:5000", "broker_addr": "10.0.0.1:9092",
            "status": "answered", "request_bytes": 100, "response_bytes": 50, "latency_us": 1500,
            "topics": topics, "errors": [], "client_software_name": software, "client_software_version": "2.0"}


def _conn(stats: LiveStats, conn: str) -> dict[str, Any]:
    return next(c for c in stats.clients_json()["clients"] if c["conn_id"] == conn)


def test_topics_are_capped_exactly_and_the_rest_counted():
    stats = LiveStats("p1")
    names = [f"t{i:03}" for i in range(150)]
    stats.request(_row("c1", names[:40]))  # below the cap, then a request that crosses it
    stats.request(_row("c1", names[30:130]))
    stats.request(_row("c1", names))  # the same again and 20 more: counted once each
    stats.request(_row("c1", names[::-1]))
    c1 = _conn(stats, "c1")
    assert len(c1["topics"]) == MAX_TOPICS_PER_CLIENT and set(c1["topics"]) < set(names)
    assert c1["topics_more"] == 150 - MAX_TOPICS_PER_CLIENT
    stats.request(_row("c2", names[:10]))
    assert _conn(stats, "c2")["topics_more"] == 0


def test_topics_more_stops_counting_at_its_bound():
    stats = LiveStats("p1")
    stats.request(_row("c1", [f"t{i}" for i in range(MAX_TOPICS_PER_CLIENT + MAX_TOPICS_MORE + 500)]))
    stats.request(_row("c1", ["another"]))
    assert _conn(stats, "c1")["topics_more"] == MAX_TOPICS_MORE
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), None, 1.0, 400, 50, False)
    assert f"+{MAX_TOPICS_MORE}+ more: " in screen


def test_top_says_how_many_topics_are_not_listed_before_the_list():
    stats = LiveStats("p1")
    stats.request(_row("c1", [f"t{i:03}" for i in range(150)]))
    metrics = parse_metrics(stats.render_prometheus())
    for per_connection in (False, True):
        screen = render(stats.clients_json(), metrics, None, 1.0, 120, 50, False, per_connection=per_connection)
        row = next(ln for ln in screen.splitlines() if ln.startswith("app "))
        assert "+86 more: t000,t001" in row, row  # at the start of the cell: a narrow screen cuts the list, not this


def test_control_characters_in_what_clients_send_stay_on_their_row():
    assert printable("a\nb\x1b[31mc\x9b\x7f\tok é") == "a\\nb\\x1b[31mc\\x9b\\x7f\\tok é"
    stats = LiveStats("p1")
    stats.request(_row("c1", ["orders\r\x1b[2J"], client_id="evil\nclient\x1b[31m", software="sw\x07"))
    metrics = parse_metrics(stats.render_prometheus())
    for per_connection in (False, True):
        screen = render(stats.clients_json(), metrics, None, 1.0, 400, 50, False, per_connection=per_connection)
        rows = [ln for ln in screen.splitlines() if "evil" in ln]
        assert len(rows) == 1 and rows[0].startswith("evil\\nclient\\x1b[31m"), screen
        assert "orders\\r\\x1b[2J" in rows[0] and "sw\\x07" in rows[0]
        assert not any(ch in screen for ch in "\x1b\r\x07")  # color=False: no escape code at all


def test_wide_characters_keep_the_columns_aligned():
    """Columns were measured in characters: a client_id or topic in CJK (two terminal columns a character)
    pushed every later column of its row to the right."""
    from recording.terminal_text import cut_to_width, display_width, pad_to_width

    assert display_width("注文サービス") == 12 and display_width("café") == 4 and display_width("e\u0301") == 1
    assert cut_to_width("注文サービス", 7) == "注文サ…" and display_width(cut_to_width("注文サービス", 7)) == 7
    assert cut_to_width("注文", 4) == "注文" and pad_to_width("注", 4) == "注  "
    stats = LiveStats("p1")
    stats.request(_row("c1", ["注文"], client_id="注文サービス"))
    stats.request(_row("c2", ["orders"], client_id="orders-service"))
    metrics = parse_metrics(stats.render_prometheus())
    screen = render(stats.clients_json(), metrics, None, 1.0, 400, 50, False)
    wide, narrow = (next(ln for ln in screen.splitlines() if ln.startswith(who)) for who in ("注文", "orders-service"))
    # every column after the client's starts at the same terminal column on both rows
    starts = [display_width(wide[:wide.index(cell)]) for cell in ("kafka-python", "10.0.0.1:9092") if cell in wide]
    assert starts and starts == [display_width(narrow[:narrow.index(cell)]) for cell in ("kafka-python", "10.0.0.1:9092")
                                 if cell in narrow], screen
