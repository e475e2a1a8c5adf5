"""The `--workers` parent's merged /metrics when a worker does not answer, without processes (a fake pool)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import proxy.workers as workers
from proxy.live import parse_metrics
from proxy.workers import Worker, WorkerStats


def _metrics(proxy_id: str, requests: int, open_conns: int) -> bytes:
    return (f'# HELP kafkatap_requests_total Requests.\n# TYPE kafkatap_requests_total counter\n'
            f'kafkatap_requests_total{{proxy="{proxy_id}",api="Produce",version="9"}} {requests}\n'
            f'# HELP kafkatap_open_connections Open.\n# TYPE kafkatap_open_connections gauge\n'
            f'kafkatap_open_connections{{proxy="{proxy_id}"}} {open_conns}\n').encode()


class _Pool:
    def __init__(self, proxy_id: str) -> None:
        self.proxy_id = proxy_id
        self.restarts = 0
        self.workers = [Worker(i, f"{proxy_id}-w{i}", SimpleNamespace(pid=100 + i), f"127.0.0.1:{9000 + i}", True)
                        for i in (1, 2)]


def _scrape(stats: WorkerStats, answers: dict[str, bytes | None], monkeypatch: pytest.MonkeyPatch) -> dict:
    async def get(addr: str, path: str) -> bytes:
        body = answers[addr]
        if body is None:
            raise asyncio.TimeoutError
        return body

    monkeypatch.setattr(workers, "_http_get", get)
    return parse_metrics(asyncio.run(stats.render_prometheus()))


def _total(m: dict, name: str) -> float:
    return sum(v for _, v in m.get(name, []))


def test_a_worker_that_misses_a_scrape_keeps_its_counts_until_its_process_changes(monkeypatch) -> None:
    """Left out, its whole count dropped from every merged counter and came back at the next scrape: Prometheus
    reads that as two counter resets (a rate() spike the size of the worker's history)."""
    pool = _Pool("p")
    stats = WorkerStats(pool)  # type: ignore[arg-type]
    both = {"127.0.0.1:9001": _metrics("p-w1", 5, 1), "127.0.0.1:9002": _metrics("p-w2", 7, 2)}
    m = _scrape(stats, both, monkeypatch)
    assert _total(m, "kafkatap_requests_total") == 12 and _total(m, "kafkatap_workers_unreachable") == 0
    m = _scrape(stats, {**both, "127.0.0.1:9002": None}, monkeypatch)  # worker 2 busy: its last answer stands
    assert _total(m, "kafkatap_requests_total") == 12 and _total(m, "kafkatap_workers_unreachable") == 1
    assert _total(m, "kafkatap_open_connections") == 3



def test_a_restarted_worker_s_counters_are_carried_so_totals_never_go_down(monkeypatch) -> None:
    """After a worker's restart the merged counters fell by its count only (12 → 5): rate() reads any drop as a
    reset to zero, so the surviving worker's whole history showed up as new requests in one interval."""
    pool = _Pool("p")
    stats = WorkerStats(pool)  # type: ignore[arg-type]
    both = {"127.0.0.1:9001": _metrics("p-w1", 5, 1), "127.0.0.1:9002": _metrics("p-w2", 7, 2)}
    _scrape(stats, both, monkeypatch)
    pool.workers[1].process = SimpleNamespace(pid=999)  # restarted: the new process counts from zero
    m = _scrape(stats, {**both, "127.0.0.1:9002": None}, monkeypatch)  # not listening yet
    assert _total(m, "kafkatap_requests_total") == 12
    assert _total(m, "kafkatap_open_connections") == 1  # a gauge says how things are now: the dead one's went
    m = _scrape(stats, {**both, "127.0.0.1:9002": _metrics("p-w2", 3, 1)}, monkeypatch)
    assert _total(m, "kafkatap_requests_total") == 15 and len(m["kafkatap_requests_total"]) == 1
    assert dict((lb["worker"], v) for lb, v in m["kafkatap_worker_requests_total"]) == {"p-w1": 5, "p-w2": 10}
    pool.workers[1].process = SimpleNamespace(pid=999)  # restarted again, given the same pid: still another process
    m = _scrape(stats, {**both, "127.0.0.1:9002": _metrics("p-w2", 1, 0)}, monkeypatch)
    assert _total(m, "kafkatap_requests_total") == 5 + 7 + 3 + 1


def test_an_answer_from_a_worker_restarted_during_the_scrape_is_its_old_process_s(monkeypatch) -> None:
    """The answer was stored under the new process, and the old process's earlier answer carried as well: the
    totals went 12 → 21 → 13 (a spike, then a drop that rate() reads as a reset)."""
    pool = _Pool("p")
    stats = WorkerStats(pool)  # type: ignore[arg-type]
    both = {"127.0.0.1:9001": _metrics("p-w1", 5, 1), "127.0.0.1:9002": _metrics("p-w2", 7, 2)}
    _scrape(stats, both, monkeypatch)

    async def restarted_while_asked(addr: str, path: str) -> bytes:
        if addr == "127.0.0.1:9002":  # it answers, dies and is restarted before the scrape ends
            pool.workers[1].process = SimpleNamespace(pid=555)
            return _metrics("p-w2", 9, 2)
        return both[addr]

    monkeypatch.setattr(workers, "_http_get", restarted_while_asked)
    m = parse_metrics(asyncio.run(stats.render_prometheus()))
    assert _total(m, "kafkatap_requests_total") == 5 + 9  # the old process's last answer, carried once
    m = _scrape(stats, {**both, "127.0.0.1:9002": _metrics("p-w2", 1, 0)}, monkeypatch)
    assert _total(m, "kafkatap_requests_total") == 5 + 9 + 1


def test_a_label_value_with_a_line_separator_does_not_break_the_merge(monkeypatch) -> None:
    """A broker advertising a host with a \\r or U+2028 (left unescaped, as the format allows): the merge split the
    sample there and served an exposition Prometheus refuses whole, or failed every scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    odd = (b'# HELP kafkatap_bypass_advertised_total Odd.\n# TYPE kafkatap_bypass_advertised_total counter\n'
           + 'kafkatap_bypass_advertised_total{proxy="p-w1",address="cr\rhost\u2028x{z:9092"} 2\n'.encode())
    answers = {"127.0.0.1:9001": _metrics("p-w1", 5, 1) + odd, "127.0.0.1:9002": _metrics("p-w2", 7, 2)}
    m = _scrape(WorkerStats(_Pool("p")), answers, monkeypatch)  # type: ignore[arg-type]
    assert m["kafkatap_bypass_advertised_total"] == [({"proxy": "p", "address": "cr\rhost\u2028x{z:9092"}, 2.0)]

    async def get(addr: str, path: str) -> bytes:
        return answers[addr]

    monkeypatch.setattr(workers, "_http_get", get)
    text = asyncio.run(WorkerStats(_Pool("p")).render_prometheus())  # type: ignore[arg-type]
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"kafkatap_bypass_advertised", "kafkatap_requests"} <= names


def test_the_parents_own_lines_are_exact_and_escaped(monkeypatch) -> None:
    """`{v:g}` printed 1234567 as 1.23457e+06; a proxy id with a quote broke the whole exposition."""
    pool = _Pool('a"b')
    text_answers = {"127.0.0.1:9001": _metrics('a\\"b-w1', 1_234_567, 1), "127.0.0.1:9002": _metrics('a\\"b-w2', 1, 0)}

    async def get(addr: str, path: str) -> bytes:
        return text_answers[addr]

    monkeypatch.setattr(workers, "_http_get", get)
    text = asyncio.run(WorkerStats(pool).render_prometheus())  # type: ignore[arg-type]
    assert 'kafkatap_worker_requests_total{proxy="a\\"b",worker="a\\"b-w1"} 1234567' in text
    assert 'kafkatap_workers{proxy="a\\"b"} 2' in text
    assert "e+06" not in text
