"""``rlm show --html``: the page of a family run, opened in a real headless Chromium.

One scripted family run for the module: a root that prints a hostile string, asks
a sub-call, starts a child (whose prompt is hostile too), delegates to a real
a2a-sdk peer on 127.0.0.1 and answers; the child reads and answers. The page is
written by the installed ``rlm`` command and opened from ``file://`` in Debian's
Chromium (``./dev`` installs it), driven by Playwright through ``executable_path``
because Playwright cannot download its own browsers here. One browser serves
the module; each test gets a fresh page.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.session import RunResult
from rlmfamily.settings import RLMSettings

from .a2a.peer_servers import SdkPeer, a2a_settings
from .family.support import child, run_root, script
from .test_cli import rlm

pytestmark = pytest.mark.timeout(120)

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = '</script><img src=x onerror="window.pwned=1"><b id="injected">bold</b>'
HOSTILE_PROMPT = "count the crates <script>window.pwned2=1</script>"
ROOT_TURNS = [
    {"text": "Let me look. " + HOSTILE,
     "code": f"print({HOSTILE!r})\nr = llm_query('What is MAX_CRATES?', context.chunk(1000)[0])\n"
             "print('sub-call said', r.text)"},
    {"code": f"h = rlm.run({HOSTILE_PROMPT!r})\n"
             "d = a2a.start('review', 'review this file', 'MAX_CRATES = 40', request_id='r-1')\n"
             "print('child said', h.wait(50)['answer'], 'review', d.wait(10)['state'])"},
    {"code": "print('x' * 3000)"},
    {"code": "final_answer('40 crates; the review found nothing')"},
]
CHILD_TURNS = ["print('child sees', context.read('ferry.txt').splitlines()[1])", "final_answer('40')"]
CRATES_RULE = [{"pattern": r"MAX_CRATES = (\d+).*What is MAX_CRATES", "answer": r"\1"}]


@dataclass
class FamilyRun:
    settings: RLMSettings
    result: RunResult
    page: Path
    html: str
    calls: int
    runs_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.runs_dir = self.settings.runs_dir


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyRun]:
    tmp = tmp_path_factory.mktemp("family")
    peer = SdkPeer()
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in __import__("os").environ if n.startswith("RLM_")]:
            env.delenv(name)
        env.setenv("REVIEW_KEY", "sk_test_review")
        peers = tmp / "peers.toml"
        peers.write_text(f'[[peers]]\nalias = "review"\nurl = "{peer.url}"\nskill = "code-review"\n'
                         'credential_env = "REVIEW_KEY"\ndescription = "Reviews code"\n')
        settings = a2a_settings(tmp / "data", a2a_peers_file=peers)
        try:
            result = run_root(settings, tmp, script(ROOT_TURNS, [child("count the crates", *CHILD_TURNS)],
                                                    subcall=CRATES_RULE))
        finally:
            peer.close()
    assert result.stop_reason == "answered", result.error
    page = tmp / "page.html"
    shown = rlm("show", "--html", result.run_id, "-o", str(page), data_dir=settings.data_dir)
    assert shown.returncode == 0, shown.stderr
    assert str(page) in shown.stderr
    calls = BudgetLedger(settings.budget_path).snapshot(result.run_id).calls
    yield FamilyRun(settings, result, page, page.read_text(encoding="utf-8"), calls)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), "no /usr/bin/chromium: `./dev test` installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@dataclass
class OpenPage:
    page: Any
    console_errors: list[str]
    requests: list[str]


@pytest.fixture
def opened(browser: Any, family: FamilyRun) -> Iterator[OpenPage]:
    context = browser.new_context()
    page = context.new_page()
    seen = OpenPage(page, [], [])
    page.on("console", lambda m: seen.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen.console_errors.append(str(e)))
    page.on("request", lambda r: seen.requests.append(r.url))
    page.goto(family.page.as_uri())
    yield seen
    context.close()


def visible_run(page: Any) -> Any:
    shown = page.locator("section.run:visible")
    assert shown.count() == 1, "one run's trajectory is shown at a time"
    return shown


def test_the_page_shows_the_roots_turns_code_output_and_sub_calls(opened: OpenPage, family: FamilyRun) -> None:
    root = visible_run(opened.page)
    assert root.get_attribute("data-run") == family.result.run_id
    turns = root.locator("details.turn")
    assert turns.count() == len(ROOT_TURNS)
    assert [turns.nth(i).locator("summary").inner_text().split(" ·")[0] for i in range(turns.count())] == [
        "turn 1", "turn 2", "turn 3", "turn 4"]
    first = turns.nth(0)
    assert "llm_query('What is MAX_CRATES?'" in first.locator("pre.code").inner_text()
    assert "sub-call said 40" in first.locator("pre.output").inner_text()
    assert "What is MAX_CRATES?" in first.locator(".subcall").inner_text()
    assert "on ferry.txt:1-3" in first.locator(".subcall p").inner_text()  # the chunk it answered: path and lines
    answer = root.locator(".outcome").inner_text()
    assert "answered" in answer and "40 crates; the review found nothing" in answer
    assert opened.console_errors == [], "the page runs under its own policy without a violation"


def test_clicking_a_childs_node_opens_its_own_trajectory(opened: OpenPage, family: FamilyRun) -> None:
    page = opened.page
    child_id = f"{family.result.run_id}.c1"
    node = page.locator("nav.tree .node", has_text="c1")
    assert node.count() == 1 and "completed" in node.inner_text()
    node.click()
    shown = visible_run(page)
    assert shown.get_attribute("data-run") == child_id
    assert HOSTILE_PROMPT in shown.locator(".question").inner_text()
    turns = shown.locator("details.turn")
    assert turns.count() == len(CHILD_TURNS)
    assert "child sees MAX_CRATES = 40" in turns.nth(0).locator("pre.output").inner_text()
    assert "40" in shown.locator(".outcome").inner_text()
    # Back to the root through the tree, then to the child again from the root's own record of starting it.
    page.locator("nav.tree .node", has_text="root").click()
    assert visible_run(page).get_attribute("data-run") == family.result.run_id
    page.locator("section.run:visible button.open-run", has_text="c1").first.click()
    assert visible_run(page).get_attribute("data-run") == child_id


def test_the_budget_chart_draws_every_call_of_the_family(opened: OpenPage, family: FamilyRun) -> None:
    chart = opened.page.locator("svg#budget-chart")
    assert chart.is_visible()
    assert chart.locator("circle.call").count() == family.calls == 7  # 4 root turns, 1 sub-call, 2 child turns
    assert chart.locator("polyline.tokens").count() == 1
    labels = [chart.locator("circle.call").nth(i).locator("title").text_content() for i in range(family.calls)]
    assert sum("c1 turn" in t for t in labels) == 2 and sum("sub-call" in t for t in labels) == 1


def test_the_delegation_is_listed_with_its_peer_and_state(opened: OpenPage) -> None:
    rows = visible_run(opened.page).locator("table.delegations tbody tr")
    assert rows.count() >= 1
    text = rows.all_inner_texts()
    assert any("review" in r and "start" in r for r in text)
    assert "completed" in visible_run(opened.page).locator(".evidence").inner_text()


def test_hostile_text_from_the_model_is_shown_as_text_and_never_runs(opened: OpenPage, family: FamilyRun) -> None:
    page = opened.page
    root = visible_run(page)
    assert HOSTILE in root.locator("details.turn").nth(0).locator("pre.output").inner_text()
    assert HOSTILE in root.locator("details.turn").nth(0).locator(".model-text").inner_text()
    assert page.locator("img").count() == 0 and page.locator("#injected").count() == 0
    page.locator("nav.tree .node", has_text="c1").click()
    assert page.evaluate("typeof window.pwned === 'undefined' && typeof window.pwned2 === 'undefined'")
    assert opened.console_errors == []
    # Escaped where it is written, not only refused by the policy: the file holds no such markup.
    assert "<img" not in family.html and "<b id=" not in family.html and "window.pwned2=1</script>" not in family.html


def test_the_page_loads_nothing_and_allows_only_its_own_inline_code(opened: OpenPage, family: FamilyRun) -> None:
    assert opened.requests == [family.page.as_uri()]
    [policy] = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', family.html)
    assert "default-src 'none'" in policy
    [nonce] = re.findall(r"script-src 'nonce-([A-Za-z0-9_-]+)'", policy)
    tags = re.findall(r"<(script|style)\b([^>]*)>", family.html)
    assert tags and all(f'nonce="{nonce}"' in attributes for _, attributes in tags)


def test_long_text_is_clipped_at_the_named_setting_with_a_note(family: FamilyRun, tmp_path: Path) -> None:
    page = tmp_path / "short.html"
    shown = rlm("show", "--html", family.result.run_id, "-o", str(page), data_dir=family.settings.data_dir,
                env={"RLM_HTML_MAX_TEXT_CHARS": "500"})
    assert shown.returncode == 0, shown.stderr
    html = page.read_text(encoding="utf-8")
    assert "x" * 400 in html and "x" * 501 not in html
    assert re.search(r"\[2,\d{3} more characters not shown \(RLM_HTML_MAX_TEXT_CHARS\)", html)


def test_without_o_the_page_is_written_beside_the_trajectory(family: FamilyRun) -> None:
    shown = rlm("show", "--html", family.result.run_id, data_dir=family.settings.data_dir)
    assert shown.returncode == 0, shown.stderr
    written = family.runs_dir / family.result.run_id / "trajectory.html"
    assert written.is_file() and str(written) in shown.stderr
    assert shown.stdout == ""


def test_a_run_that_did_not_finish_says_so_on_its_page(family: FamilyRun, tmp_path: Path) -> None:
    # The root's trajectory as a crash before its last line leaves it, with its child beside it.
    runs = tmp_path / "runs"
    for run_id in (family.result.run_id, f"{family.result.run_id}.c1"):
        (runs / run_id).mkdir(parents=True)
        lines = (family.runs_dir / run_id / "trajectory.jsonl").read_text().splitlines(keepends=True)
        kept = lines[:-1] if run_id == family.result.run_id else lines
        (runs / run_id / "trajectory.jsonl").write_text("".join(kept))
    page = tmp_path / "crashed.html"
    shown = rlm("show", "--html", str(runs / family.result.run_id / "trajectory.jsonl"), "-o", str(page),
                data_dir=tmp_path / "other-data")
    assert shown.returncode == 0, shown.stderr
    html = page.read_text(encoding="utf-8")
    assert f"did not finish after {len(ROOT_TURNS)} turns" in html
    assert "root · did not finish" in html and "c1 · completed" in html
