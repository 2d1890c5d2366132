"""Score classify_operational_question + get_incident_playbook against the golden prompt pack
(yuzu://golden-prompts/enterprise-it-v1). See README.md beside this file.

    .venv/bin/python bench/prompt_pack/run.py                  # every split, per category
    .venv/bin/python bench/prompt_pack/run.py --split tune --failures
    .venv/bin/python bench/prompt_pack/run.py --json

The score is expected-first-tool accuracy: a question scores when the first tool the classifier suggests
(a matched incident playbook's first tool comes first) is the expected first tool or an acceptable
alternative. Suggesting a must-not-call-first tool is counted separately. No server, no database: the
classifier and the playbooks are pure functions.
"""

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("tune", "holdout")


def setup():
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yuzu.settings")
    import django

    django.setup()


def evaluate(pack=None):
    """One row per question: what the classifier suggested first, and whether that scores."""
    from fleet.orientation import classify, golden_pack, playbook

    pack = pack or golden_pack()
    rows = []
    for q in pack["questions"]:
        out = classify(q["question"])
        first = out["suggested_tools"][0]
        book = playbook(out["playbook"]) if out.get("playbook") else None
        rows.append({
            "id": q["id"], "split": q["split"], "category": q["category"], "question": q["question"],
            "expected": q["expected_first_tool"], "acceptable": q["acceptable_first_tools"],
            "suggested": first, "classified_as": out["category"], "playbook": out.get("playbook"),
            "playbook_first_tool": book["first_tool"] if book and book["found"] else None,
            "exact": first == q["expected_first_tool"],
            "ok": first == q["expected_first_tool"] or first in q["acceptable_first_tools"],
            "forbidden": first in q["must_not_call_first"],
        })
    return rows


def summary(rows):
    def stats(subset):
        n = len(subset)
        return {"questions": n, "score": round(sum(r["ok"] for r in subset) / n, 4) if n else None,
                "exact": round(sum(r["exact"] for r in subset) / n, 4) if n else None,
                "forbidden_first": sum(r["forbidden"] for r in subset)}

    by_split = {s: stats([r for r in rows if r["split"] == s]) for s in SPLITS}
    by_category = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    return {"all": stats(rows), **by_split, "categories": {c: stats(v) for c, v in sorted(by_category.items())}}


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("all",) + SPLITS, default="all",
                    help="report only this split (tune while tuning: never look at the holdout's rows)")
    ap.add_argument("--failures", action="store_true", help="list the questions of the split that did not score")
    ap.add_argument("--json", action="store_true", help="print the summary (and rows with --failures) as JSON")
    ap.add_argument("--min", type=float, default=None, help="exit 1 when the split's score is below this")
    a = ap.parse_args(argv)
    setup()
    rows = evaluate()
    chosen = rows if a.split == "all" else [r for r in rows if r["split"] == a.split]
    result = summary(chosen)
    misses = [r for r in chosen if not r["ok"] or r["forbidden"]]
    if a.json:
        print(json.dumps({"summary": result, **({"failures": misses} if a.failures else {})}, indent=1))
    else:
        print(f"golden prompt pack enterprise-it-v1 — expected-first-tool accuracy ({a.split})")
        for name in ("all",) + SPLITS:
            s = result[name]
            if s["questions"]:
                print(f"  {name:8} {pct(s['score']):>7}  ({s['questions']} questions; exact {pct(s['exact'])}; "
                      f"must-not-call-first suggested: {s['forbidden_first']})")
        for name, s in result["categories"].items():
            print(f"  · {name:11} {pct(s['score']):>7}  ({s['questions']})")
        if a.failures:
            for r in misses:
                print(f"  ✗ {r['id']} [{r['classified_as']}] suggested {r['suggested']}, expected {r['expected']}"
                      f"{' (FORBIDDEN)' if r['forbidden'] else ''}: {r['question']}")
    score = result["all"]["score"]
    return 1 if a.min is not None and (score is None or score < a.min) else 0


if __name__ == "__main__":
    sys.exit(main())
