"""The golden prompt pack (yuzu://golden-prompts/enterprise-it-v1): well-formed, served as a resource, scored
by bench/prompt_pack/run.py at ≥ 90 % expected-first-tool accuracy, and the score its README records is the
score the harness prints."""

import importlib.util
import json
import re

import pytest
from jsonschema import Draft202012Validator

from fleet.orientation import (
    CLASSIFY_SCHEMA,
    GOLDEN_PACK,
    PLAYBOOKS,
    classify,
    golden_pack,
    playbook,
)
from mcp.registry import catalogue
from tests.support.mcp_http import McpClient
from yuzu.testing import ROOT

CATEGORIES = {"incidents", "compliance", "inventory", "approvals", "bridge"}


def harness():
    spec = importlib.util.spec_from_file_location("prompt_pack_run", ROOT / "bench" / "prompt_pack" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pack_is_well_formed():
    pack = golden_pack()
    questions = pack["questions"]
    assert pack["id"] == "enterprise-it-v1" and len(questions) >= 40
    assert len({q["id"] for q in questions}) == len(questions)
    assert {q["category"] for q in questions} == CATEGORIES
    tools = set(catalogue("v1").tools) | set(catalogue("bridge").tools)
    for q in questions:
        named = {q["expected_first_tool"], *q["acceptable_first_tools"], *q["must_not_call_first"]}
        assert named <= tools, (q["id"], named - tools)
        assert q["expected_first_tool"] not in q["must_not_call_first"] + q["acceptable_first_tools"], q["id"]
        assert not set(q["acceptable_first_tools"]) & set(q["must_not_call_first"]), q["id"]
        assert 10 <= len(q["question"]) <= 2048 and q["split"] in ("tune", "holdout")
    holdout = sum(q["split"] == "holdout" for q in questions)
    assert abs(holdout - len(questions) / 4) <= 1  # a quarter held out


def test_the_classifier_scores_at_least_90_percent_and_never_suggests_a_forbidden_first_tool():
    run = harness()
    rows = run.evaluate()
    summary = run.summary(rows)
    assert summary["all"]["score"] >= 0.9, [r for r in rows if not r["ok"]]
    assert summary["holdout"]["score"] >= 0.9 and summary["tune"]["score"] >= 0.9
    assert summary["all"]["forbidden_first"] == 0
    validator = Draft202012Validator(CLASSIFY_SCHEMA)
    for q in golden_pack()["questions"]:
        assert list(validator.iter_errors(classify(q["question"]))) == [], q["id"]


def test_the_readme_records_the_score_the_harness_prints():
    run = harness()
    summary = run.summary(run.evaluate())
    readme = (ROOT / "bench" / "prompt_pack" / "README.md").read_text()
    block = readme.split("<!-- prompt-pack-score -->")[1].split("<!-- /prompt-pack-score -->")[0]
    recorded = {m[0]: m[1:] for m in re.findall(r"^\| (\w+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \| (\d+) \|$", block,
                                                re.M)}
    assert set(recorded) == {"all", "tune", "holdout"}
    for split, (n, score, exact, forbidden) in recorded.items():
        s = summary[split]
        assert (int(n), float(score), float(exact), int(forbidden)) == (
            s["questions"], round(100 * s["score"], 1), round(100 * s["exact"], 1), s["forbidden_first"]), split
    assert f"{len(golden_pack()['questions'])} questions" in readme


def test_the_cli_prints_and_gates(capsys):
    assert harness().main(["--split", "tune", "--min", "0.9"]) == 0
    assert "expected-first-tool accuracy (tune)" in capsys.readouterr().out
    assert harness().main(["--json", "--min", "1.01"]) == 1
    assert json.loads(capsys.readouterr().out)["summary"]["all"]["questions"] == len(golden_pack()["questions"])


def test_playbooks_match_by_name_or_description():
    assert playbook("agent offline")["first_tool"] == "get_agent_details"
    assert playbook("  Disk FULL ")["scenario"] == "disk full"
    assert playbook("web-03 went offline this morning")["scenario"] == "agent offline"
    assert playbook("the EDR sensor is down on laptops")["scenario"] == "endpoint security client outage"
    missing = playbook("printer out of toner")
    assert missing["found"] is False and missing["known_scenarios"] == sorted(PLAYBOOKS)
    # A question that names an incident carries its playbook, and the playbook's first tool comes first.
    out = classify("We suspect db-02 is compromised")
    assert out["playbook"] == "suspected compromise"
    assert out["suggested_tools"][0] == playbook(out["playbook"])["first_tool"]


@pytest.mark.django_db(transaction=True)
def test_the_pack_is_an_mcp_resource(mint):
    c = McpClient(mint("viewer", role="Viewer", tier="readonly"))
    c.initialize()
    uris = [r["uri"] for r in c.rpc("resources/list").json()["result"]["resources"]]
    assert "yuzu://golden-prompts/enterprise-it-v1" in uris
    content = c.rpc("resources/read", {"uri": "yuzu://golden-prompts/enterprise-it-v1"}).json()["result"]["contents"][0]
    assert content["mimeType"] == "application/json"
    assert json.loads(content["text"]) == json.loads(GOLDEN_PACK.read_text())
