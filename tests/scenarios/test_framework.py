"""The scenario framework without Spark: catalog shape, chains, traffic drivers on a real broker, cleanup.

Fast checks that a broken catalog module or a driver regression shows up
before the minutes-long end-to-end runs in test_scenarios.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from scenarios.catalog import MODULES, all_scenarios, get
from scenarios.clients import ClientSpec, command_for, run_client
from scenarios.runner import _proxy_order, create_topics, run_scenario
from scenarios.spec import Broker, Expect, Proxy, Report, Scenario
from scenario_helpers import children


def test_catalog_is_complete_and_well_formed() -> None:
    names = [s.name for s in all_scenarios()]
    assert names == ["batch-too-large", "idle-firewall", "who-is-writing", "connection-surge", "no-window-scaling",
                     "middlebox-latency", "leader-moves", "coordinator-lost"]
    assert len(MODULES) == len(names)
    for s in all_scenarios():
        assert s.expect, f"{s.name} expects nothing"
        assert s.story and s.clients
        s.entry_proxy()  # resolvable
        _proxy_order(s.proxies)
        for c in s.clients:
            assert c.count or c.duration_s, f"{s.name}/{c.name} is unbounded"
    assert get("no-window-scaling").needs_root and not get("batch-too-large").needs_root


def test_chain_order_and_entry() -> None:
    s = get("middlebox-latency")
    assert [p.name for p in _proxy_order(s.proxies)] == ["B", "middlebox", "A"]
    assert s.entry_proxy().name == "A"
    with pytest.raises(ValueError):
        _proxy_order([Proxy("x", upstream="y"), Proxy("y", upstream="x")])


def test_expect_reads_findings_json(tmp_path) -> None:
    (tmp_path / "findings.json").write_text(json.dumps({"findings": [{"id": "a", "title": "A", "evidence": {"n": 3}}]}))
    rep = Report(tmp_path)
    assert Expect("a").problems(rep) == []
    assert Expect("b").problems(rep) == ["expected finding b missing"]
    assert Expect("a", absent=True).problems(rep)
    assert Expect("a", lambda f, r: None if f[0]["evidence"]["n"] == 3 else "bad").problems(rep) == []
    assert Expect("a", lambda f, r: "n too small").problems(rep) == ["finding a: n too small"]


def test_scenario_list_cli() -> None:
    from kafkatap.cli import cli

    res = CliRunner().invoke(cli, ["scenario", "list"])
    assert res.exit_code == 0, res.output
    for s in all_scenarios():
        assert s.name in res.output
    assert "root" in res.output


def test_unknown_scenario_is_a_usage_error() -> None:
    from kafkatap.cli import cli

    res = CliRunner().invoke(cli, ["scenario", "run", "nope", "--out", "/tmp/x"])
    assert res.exit_code == 2 and "unknown scenario" in res.output


def test_a_scenario_file_that_is_missing_or_defines_no_scenario_is_a_usage_error(tmp_path) -> None:
    """The documented write-your-own path: a traceback (AttributeError) for a file without SCENARIO, and a missing
    file was called an unknown scenario."""
    from kafkatap.cli import cli

    mine = tmp_path / "my_incident.py"
    mine.write_text("X = 1\n")
    for path, says in ((mine, "defines no SCENARIO"), (tmp_path / "missing.py", "no such file")):
        res = CliRunner().invoke(cli, ["scenario", "run", str(path), "--out", str(tmp_path / "out")])
        assert res.exit_code == 2 and says in res.output and not isinstance(res.exception, AttributeError), res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["kafka-python", "confluent", "kcat"])
def test_drivers_produce_and_consume_on_a_real_broker(kafka_broker, topic_name, kind) -> None:
    create_topics("127.0.0.1", kafka_broker.port, {topic_name: 1})
    p = run_client(ClientSpec(f"p-{kind}", kind=kind, topics=[topic_name], count=20, rate=200, duration_s=20,
                              bootstrap=kafka_broker.bootstrap))
    assert p["sent"] == 20 and p["errors"] == 0, p
    # consumers run as the runner runs them: a separate process
    spec = ClientSpec(f"c-{kind}", kind=kind, role="consumer", topics=[topic_name], count=20, duration_s=25,
                      group=f"g-{kind}" if kind != "kcat" else None, bootstrap=kafka_broker.bootstrap)
    out = subprocess.run(command_for(spec), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["received"] == 20


def test_surge_driver_opens_many_connections(kafka_broker) -> None:
    r = run_client(ClientSpec("s", kind="surge", role="connections", connections=50, duration_s=1.5,
                              bootstrap=kafka_broker.bootstrap))
    assert r["connected"] == 50 and r["requests"] >= 100 and r["errors"] == 0, r


@pytest.mark.kafka
def test_runner_without_analysis_records_through_a_chain(tmp_path) -> None:
    """Two proxies in a chain, the broker advertising the first: every client connection is recorded."""
    import pyarrow.dataset as ds

    sc = Scenario(
        name="chain-smoke", story="smoke",
        broker=Broker(topics={"t": 1}),
        proxies=[Proxy("rec"), Proxy("front", upstream="rec", record=False)],
        clients=[ClientSpec("p", topics=["t"], count=30, rate=100, duration_s=10)],
        expect=[],
    )
    before = children()  # e.g. the session's broker fixture
    res = run_scenario(sc, tmp_path, analyze=False, progress=False)
    assert res.clients[0]["sent"] == 30 and res.ok, res
    reqs = ds.dataset(tmp_path / "recordings" / "rec" / "requests", partitioning="hive").to_table().to_pylist()
    produced = sum(r["records"] or 0 for r in reqs if r["api_name"] == "Produce")
    assert produced == 30, "produce bypassed the proxy chain"
    left = children() - before
    assert not left, f"child processes left behind: {left}"


def test_cli_module_imports() -> None:
    import scenarios.cli as c

    assert {"list", "run"} <= set(c.scenario.commands) and {"up", "down", "status"} <= set(c.kafka.commands)
    assert sys.executable


@pytest.mark.kafka
def test_a_run_never_changes_the_catalog_specs(monkeypatch, tmp_path):
    """Two runs of one scenario on different Kafka versions: the second must not inherit the first's client settings.

    The runner used to write the broker's version into the catalog's ClientSpec objects, so a who-is-writing
    run on 4.3.1 left "4.3.1" there and the 3.7 run that followed started 4.3.1's Java tools against 3.7.2.
    """
    import dataclasses

    import scenarios.runner as runner
    from scenarios.catalog import get

    scenario = get("who-is-writing")
    before = [dataclasses.asdict(c) for c in scenario.clients]
    seen: list[list[str]] = []

    class Boom(Exception):
        pass

    def fake_run(self, specs, hosts):  # stop right after the runner handed the specs to the clients
        seen.append([s.kafka_version for s in specs if s.kind == "java"])
        raise Boom()

    monkeypatch.setattr(runner._Clients, "run", fake_run)
    for version in ("4.3.1", "3.7.2"):
        try:
            runner.run_scenario(scenario, tmp_path / version, kafka_version=version)
        except Boom:
            pass
    assert seen == [["4.3.1", "4.3.1"], ["3.7.2", "3.7.2"]]
    assert [dataclasses.asdict(c) for c in scenario.clients] == before


@pytest.mark.parametrize("command", [["demo"], ["scenario", "run", "batch-too-large"]], ids=["demo", "scenario-run"])
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_exits_128_plus_the_signal(monkeypatch, tmp_path, command, signum, status) -> None:
    """Ctrl-C and SIGTERM end a run with the shell's status for the signal, as the analysis's own handler does
    (analytics.interrupt.ExitAtOnce): a SIGTERM outside the analysis used to exit 130, inside it 143.
    No broker: the run is replaced by one that gets the signal the moment it starts."""
    from kafkatap.cli import cli

    def signalled(*args, **kwargs):
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # what Python's own SIGINT handler raises
        os.kill(os.getpid(), signum)  # sigterm_as_interrupt turns it into an exception here
        pytest.fail("SIGTERM did not interrupt the run")

    monkeypatch.setattr("scenarios.runner.run_scenario", signalled)
    res = CliRunner().invoke(cli, [*command, "--out", str(tmp_path / "out")])
    assert res.exit_code == status, res.output
    assert "interrupted; everything it started was stopped" in res.output


def test_a_signal_held_during_a_block_is_raised_with_its_number() -> None:
    """What `_signals_deferred` raises after its block says which signal came, for the exit status above."""
    from scenarios.runner import SignalInterrupt, _signals_deferred

    try:  # not pytest.raises(SignalInterrupt): a plain KeyboardInterrupt would end the whole test session
        with _signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
    except KeyboardInterrupt as exc:
        raised = exc
    else:
        pytest.fail("the held SIGTERM was not raised after the block")
    assert isinstance(raised, SignalInterrupt) and raised.signum == signal.SIGTERM, repr(raised)


@pytest.mark.parametrize("command", [["demo"], ["scenario", "run", "batch-too-large"]], ids=["demo", "scenario-run"])
def test_an_out_holding_folders_no_run_wrote_is_refused_and_kept(monkeypatch, tmp_path, command) -> None:
    """A run cleared OUT/recordings, report/, clients/ and broker/ before anything else: an operator's own recording
    kept there was deleted. Only an OUT a run marked is cleared; another is refused before anything starts."""
    from kafkatap.cli import cli

    started: list[object] = []
    monkeypatch.setattr("scenarios.runner.run_scenario", lambda *a, **k: started.append(a))
    out = tmp_path / "out"
    (out / "recordings" / "prod").mkdir(parents=True)
    (out / "recordings" / "prod" / "part-0.parquet").write_bytes(b"keep me")
    res = CliRunner().invoke(cli, [*command, "--out", str(out)])
    assert res.exit_code == 2 and "no scenario run wrote" in res.output and "recordings/" in res.output, res.output
    assert not started and (out / "recordings" / "prod" / "part-0.parquet").read_bytes() == b"keep me"


def test_a_run_clears_what_an_earlier_run_wrote_in_its_out(tmp_path) -> None:
    from scenarios.runner import RUN_MARK, prepare_out

    out = tmp_path / "out"
    prepare_out(out)
    assert (out / RUN_MARK).is_file()
    (out / "recordings" / "rec").mkdir(parents=True)
    (out / "notes.md").write_text("mine")
    prepare_out(out)  # marked by the first run: its folders go, anything else stays
    assert not (out / "recordings").exists() and (out / "notes.md").read_text() == "mine"


def test_the_demos_java_consumer_is_a_classic_group_member_on_kafka_3() -> None:
    """`demo --kafka-version 3.7.2` failed every time: its check wanted a KIP-848 consumer, which Kafka 3.x's clients
    here do not use (scenarios.clients.java_group_role)."""
    from scenarios.demo import _java_named

    class Inventory:
        def __init__(self, version: str, role: str) -> None:
            self.rows = [{"client_id": "ledger-java", "role": "producer", "topics_produced": ["payments"]},
                         {"client_id": "orders-848", "role": role, "topics_consumed": ["orders"],
                          "software_version": version}]

        def table(self, name: str) -> list[dict]:
            return self.rows

    assert _java_named([], Inventory("3.7.2", "consumer, group member")) is None
    assert _java_named([], Inventory("4.3.1", "consumer, KIP-848 consumer")) is None
    assert _java_named([], Inventory("4.3.1", "consumer, group member")) is not None


def test_every_built_in_scenario_passes_the_spec_checks() -> None:
    from scenarios.demo import SCENARIO as demo
    from scenarios.validate import spec_problems

    assert {sc.name: spec_problems(sc) for sc in [*all_scenarios(), demo]} == {
        sc.name: [] for sc in [*all_scenarios(), demo]}


@pytest.mark.parametrize("body, says", [
    ('SCENARIO = Scenario(name="x", story="s", proxies=[Proxy("rec")], entry="front")',
     "entry='front' is not a proxy of this scenario (rec)"),
    ('SCENARIO = Scenario(name="x", story="s", clients=[ClientSpec("p", topics="orders")])',
     "client 'p': topics='orders' must be a list of topic names"),
    ('SCENARIO = Scenario(name="x", story="s", clients=[ClientSpec("p", kind="kafkapython", topics=["t"])])',
     "did you mean 'kafka-python'?"),
    ('SCENARIO = Scenario(name="x", story="s", clients=[ClientSpec("p", topics=["t"], host="natted")])',
     "client 'p': host='natted' is not one of the network's hosts"),
    ('SCENARIO = Scenario(name="x", story="s", broker=Broker(topics=["t"]))', "broker: topics=['t'] must map"),
    ('SCENARIO = Scenario(name="x", story="s", proxies=[Proxy("rec", kafka_faults=["eror=Produce:X"])])',
     "proxy 'rec': kafka_faults: bad fault spec 'eror=Produce:X'"),
    ('SCENARIO = Scenario(name="x", story="s", expect=[Expect("client_inventroy")])',
     "expect: 'client_inventroy' is no finding kafkatap reports; did you mean 'client_inventory'?"),
    ('SCENARIO = Scenario(name="x", story="s", proxies=[Proxy("rec", record=False)])', "none records"),
    ('SCENARIO = Scenario(name="x", story="s",\n    brokre=Broker())', "mine.py:2: TypeError: "),
    ('SCENARIO = (', "mine.py:2: SyntaxError: "),
])
def test_a_scenario_file_with_a_mistake_is_refused_in_one_line_before_anything_starts(monkeypatch, tmp_path, body,
                                                                                      says) -> None:
    """These surfaced after the broker had started (KeyError: 'natted', an empty StopIteration), after a minute of
    traffic and Spark (a misspelt finding id), as a 30-line traceback, or not at all (topics="orders" produced to
    topics o, r, d, e and s)."""
    from kafkatap.cli import cli

    started: list[object] = []
    monkeypatch.setattr("scenarios.runner.run_scenario", lambda *a, **k: started.append(a))
    f = tmp_path / "mine.py"
    f.write_text("from scenarios.spec import Broker, ClientSpec, Expect, Proxy, Scenario\n" + body + "\n")
    res = CliRunner().invoke(cli, ["scenario", "run", str(f), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, res.output
    assert not started


def test_a_proxy_is_fronted_by_every_proxy_whose_traffic_reaches_it() -> None:
    """middlebox-latency: client → A → middlebox → B. The broker advertises A's address; B was told only of the
    middlebox in front of it, so its recording said A's clients went around it (a CRITICAL bypass finding)."""
    from scenarios.catalog.middlebox_latency import SCENARIO
    from scenarios.runner import _in_front_of

    assert [q.name for q in _in_front_of(SCENARIO.proxies, "B")] == ["middlebox", "A"]
    assert [q.name for q in _in_front_of(SCENARIO.proxies, "middlebox")] == ["A"]
    assert _in_front_of(SCENARIO.proxies, "A") == []
