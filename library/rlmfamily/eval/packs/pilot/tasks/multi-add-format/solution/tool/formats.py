FORMATS = ("text", "csv")
