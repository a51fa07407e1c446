"""Code pasted in a message's text becomes the bundle: named fences are files, the rest is the task (and a
document when code without a name is left in it). Hostile text is refused with a code, never guessed around."""

from __future__ import annotations

import pytest

from workers.hosted_rlm.pasted import PASTED_DOCUMENT_PATH, PastedRefused, read_pasted

# A hang guard, not a measurement: the hostile inputs below take milliseconds read linearly and hours otherwise.
pytestmark = pytest.mark.timeout(30)

MAX_FILES = 16
MAX_BYTES = 1 << 20
DB = "def find(conn, name):\n    return conn.execute(f\"SELECT * FROM users WHERE name = '{name}'\")\n"


def read(text: str, **limits: int):
    return read_pasted(text, **{"max_files": MAX_FILES, "max_bytes": MAX_BYTES, **limits})


def files(text: str) -> dict[str, str]:
    return {i["path"]: i["text"] for i in read(text).items}


def refused(text: str, **limits: int) -> PastedRefused:
    with pytest.raises(PastedRefused) as caught:
        read(text, **limits)
    return caught.value


def test_plain_text_is_the_task_and_one_inline_document_counted_from_the_first_line():
    text = "Is this safe?\n\n    conn.execute(f'SELECT {x}')\n"
    pasted = read(text)
    assert pasted.question == text.strip()
    assert pasted.items == ({"path": PASTED_DOCUMENT_PATH, "start": 0, "end": len(text), "text": text},)


@pytest.mark.parametrize(
    "text",
    [
        f"Review.\n```python path=app/db.py\n{DB}```\n",
        f"Review.\n```python path=\"app/db.py\"\n{DB}```\n",
        f"Review.\n```py title='app/db.py'\n{DB}```\n",
        f"Review.\n```python file=app/db.py linenums=1\n{DB}```\n",
        f"Review.\n```python:app/db.py\n{DB}```\n",
        f"Review.\n```12:15:app/db.py\n{DB}```\n",
        f"Review.\n```app/db.py\n{DB}```\n",
        f"Review.\n~~~~ app/db.py\n{DB}~~~~\n",
        f"Review.\napp/db.py\n```python\n{DB}```\n",
        f"Review.\n**app/db.py**\n```python\n{DB}```\n",
        f"Review.\n`app/db.py`:\n```python\n{DB}```\n",
        f"Review.\n### app/db.py\n```python\n{DB}```\n",
        f"Review.\nFile: app/db.py\n```python\n{DB}```\n",
        f"Review.\n```python\n# file: app/db.py\n{DB}```\n",
        f"Review.\n```js\n// file: app/db.py\n{DB}```\n",
        f"Review.\n```sql\n-- file: app/db.py\n{DB}```\n",
        f"Review.\n```html\n<!-- file: app/db.py -->\n{DB}```\n",
    ],
)
def test_each_naming_convention_makes_the_block_a_file_holding_exactly_its_lines(text):
    pasted = read(text)
    assert [(i["path"], i["text"], i["start"], i["end"]) for i in pasted.items] == [("app/db.py", DB, 0, len(DB))]
    assert pasted.question.startswith("Review.") and "conn.execute" not in pasted.question


def test_a_language_word_is_not_a_path_and_unnamed_code_stays_in_the_document():
    text = f"Review.\n```app/db.py\n{DB}```\nAnd this one:\n```python\nx = eval(input())\n```\n"
    found = files(text)
    assert found["app/db.py"] == DB
    assert "x = eval(input())" in found[PASTED_DOCUMENT_PATH] and "SELECT" not in found[PASTED_DOCUMENT_PATH]


def test_longer_fences_hold_shorter_ones_and_a_closing_fence_needs_the_same_character():
    inner = "Example:\n```python\nprint(1)\n```\n~~~\nstill inside\n"
    assert files(f"Review the doc.\n````docs/howto.md\n{inner}````\n")["docs/howto.md"] == inner


def test_an_unclosed_fence_runs_to_the_end_of_the_text():
    assert files(f"Review.\n```python path=app/db.py\n{DB}")["app/db.py"] == DB
    assert files("Review.\n```app/empty.py")["app/empty.py"] == ""


def test_windows_separators_are_read_as_slashes():
    assert list(files(f"Review.\n```python path=app\\db.py\n{DB}```\n")) == ["app/db.py"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../secrets.py", "'..'"),
        ("app/../../etc/passwd", "'..'"),
        ("./app/db.py", "'.'"),
        ("app//db.py", "empty"),
        ("/etc/passwd", "absolute"),
        ("\\\\server\\share\\a.py", "absolute"),
        ("C:\\app\\db.py", "absolute"),
        ("~/app/db.py", "absolute"),
        ("app/db.py\u202e", "control"),
        ("x" * 1025 + ".py", "longer than 1024"),
    ],
)
def test_a_path_outside_the_bundle_is_refused_with_what_to_send_instead(path, why):
    error = refused(f"Review.\n```python path={path}\n{DB}```\n")
    assert error.code == "evidence_path_invalid"
    assert why in error.message and "relative path" in error.message


def test_a_path_in_a_comment_line_is_checked_too():
    assert refused(f"Review.\n```python\n# file: ../../etc/shadow\n{DB}```\n").code == "evidence_path_invalid"


def test_a_path_named_twice_is_refused():
    error = refused(f"Review.\n```app/db.py\n{DB}```\n```python path=app/db.py\nx = 1\n```\n")
    assert error.code == "evidence_path_duplicate" and "'app/db.py'" in error.message


def test_code_without_a_task_is_refused():
    assert refused(f"```app/db.py\n{DB}```\n").code == "task_missing"


def test_more_named_blocks_than_the_spec_allows_files_are_refused_early():
    text = "Review.\n" + "```f.py\n```\n" * 100_000  # 100,000 named blocks
    error = refused(text, max_files=256, max_bytes=4 << 20)
    assert error.code == "evidence_too_many_files" and "256" in error.message and "max_parts" in error.message


def test_many_unnamed_fences_and_long_lines_read_in_linear_time():
    text = "Review.\n" + ("```" + "`" * 10 + "x" * 4000 + "\n") * 200 + "~" * 3 + "a" * 100_000  # under 1 MiB
    pasted = read(text)
    assert [i["path"] for i in pasted.items] == [PASTED_DOCUMENT_PATH]


@pytest.mark.parametrize(
    "line",
    [
        "# file: a" + " " * 200_000 + "b",  # two runs of spaces a backtracking pattern would split every way
        "**" + "a" * 200_000 + "` " * 100_000,
        "```python " + ' path="' * 50_000,
    ],
)
def test_a_hostile_long_line_near_a_fence_is_read_in_linear_time(line):
    text = f"Review.\n{line}\n```python\n{line}\n```\n"
    try:
        read(text)
    except PastedRefused:
        pass  # refusing is fine; quadratic work (hours at this length) is not: the module's timeout says so


def test_text_over_the_specs_input_bytes_is_refused():
    error = refused("Review.\n" + "x" * 2000, max_bytes=1000)
    assert error.code == "evidence_too_large" and "max_input_bytes" in error.message
