FORMATS = ("text",)
