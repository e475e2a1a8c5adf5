"""The project's own documents: every link stays inside the repository, and docs/incidents.md answers
what findings and help texts point to (an incident's anchor, its scenario, its finding ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analytics.findings import INCIDENT_TITLES, RULES, Finding, incident_label, incident_ref
from analytics_rows import INCIDENT_RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "scenarios" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INCIDENTS = ROOT / "docs" / "incidents.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    """Explicit `<a id=…>` anchors plus GitHub's heading slugs (lower case, punctuation dropped, spaces → '-')."""
    text = md.read_text()
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}
    return set(re.findall(r'<a id="([^"]+)"', text)) | slugs


def _sections(text: str) -> dict[str, str]:
    """Anchor id → the text up to the next anchor."""
    parts = re.split(r'<a id="([^"]+)"></a>', text)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(md: Path) -> None:
    prose = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # diagrams hold arrows, not links
    links = LINK.findall(prose)
    assert links, f"{md.name} links nothing"
    for url in links:
        assert not re.match(r"[a-z]+:", url), f"{md.name}: {url} leaves the repository"
        path, _, anchor = url.partition("#")
        target = (md.parent / path).resolve() if path else md
        assert target.is_relative_to(ROOT) and target.exists(), f"{md.name}: {url} does not exist in the repository"
        if anchor:
            assert anchor in _anchors(target), f"{md.name}: {url} has no anchor #{anchor}"


def test_every_incident_a_finding_names_is_told_with_its_scenario_and_rules() -> None:
    sections = _sections(INCIDENTS.read_text())
    # a catalog module's file name is its scenario name (scenarios.catalog.get maps one to the other)
    scenarios = {p.stem.replace("_", "-") for p in (ROOT / "scenarios" / "catalog").glob("*.py") if p.stem != "__init__"}
    assert len(scenarios) >= 6
    told = set()
    for n, rules in INCIDENT_RULES.items():
        path, _, anchor = incident_ref(n).partition("#")
        assert (ROOT / path) == INCIDENTS and anchor in sections, f"incident {n}: no anchor #{anchor}"
        body = sections[anchor]
        assert rules <= RULES.keys() and all(f"`{r}`" in body for r in rules), f"incident {n} does not name {rules}"
        named = {s for s in scenarios if f"`{s}`" in body}
        assert len(named) == 1, f"incident {n} names scenarios {named}"
        told |= named
    assert "`compare_added_latency`" in sections["middlebox-latency"] and "`middlebox-latency`" in sections["middlebox-latency"]
    for name in ("leader-moves", "coordinator-lost"):  # issue 17: Kafka-level faults, not an incident
        assert f"`{name}`" in sections["kafka-faults"]
    assert "`kafka_fault_reactions`" in sections["kafka-faults"]
    assert told | {"middlebox-latency", "leader-moves", "coordinator-lost"} == scenarios  # every catalog scenario is in the document


def test_findings_name_their_incident_in_words_and_by_anchor() -> None:
    """A finding says which incident it diagnoses as the document's heading says it, with the anchor to look it
    up (a report read away from the repository still says what "incident 3" is)."""
    sections = _sections(INCIDENTS.read_text())
    assert set(INCIDENT_TITLES) == set(INCIDENT_RULES)
    for n, title in INCIDENT_TITLES.items():
        heading = re.search(r"^## (.*)$", sections[f"incident-{n}"], re.M)
        assert heading and heading.group(1) == f"{n}. {title}", f"incident {n}: docs say {heading and heading.group(1)!r}"
        assert incident_label(n) == f"incident {n}: {title} — docs/incidents.md#incident-{n}"
    doc = Finding(id="client_inventory", severity="info", title="t", summary="s", incident=3).to_json()
    assert doc["incident_doc"] == "docs/incidents.md#incident-3" and doc["incident_title"] == INCIDENT_TITLES[3]
