from tool.formats import FORMATS


def render(rows, columns, format="text"):
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    separator = "," if format == "csv" else " | "
    lines = [separator.join(columns)]
    lines += [separator.join(str(row[c]) for c in columns) for row in rows]
    return "\n".join(lines)
