"""20 JSON schemas for the structured-output tests: nested objects, arrays, enums, numbers with ranges, required
fields. Strings and arrays are bounded (maxLength / maxItems) so every completion fits a token budget (characters,
not tokens: a budget must allow the bytes of the widest ones; test_structured_output_engine.MAX_NEW)."""

NAME = {"type": "string", "minLength": 1, "maxLength": 16}

SCHEMAS = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
     "required": ["color"]},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60},
                                      "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1,
                                               "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer",
                                                                                       "minimum": 1, "maximum": 999},
                                                                                "name": NAME},
                                               "required": ["id", "name"]}}, "required": ["user"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": 0,
                                                                         "maximum": 9}},
     "required": ["ok", "count"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 100}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"city": NAME, "country": {"enum": ["France", "Italy", "Japan"]},
                                      "population": {"type": "integer", "minimum": 0, "maximum": 50000000}},
     "required": ["city", "country", "population"]},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                                      "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["answer", "confidence"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -10, "maximum": 10}, "y": {"type": "integer", "minimum": -10,
                                                                      "maximum": 10}}, "required": ["x", "y"]}},
     "required": ["point"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"sku": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["sku", "qty"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"title": NAME, "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                                      "genre": {"enum": ["drama", "comedy", "horror"]}},
     "required": ["title", "year"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["c"]}}, "required": ["b"]}},
     "required": ["a"]},
    {"type": "object", "properties": {"status": {"const": "done"}, "code": {"type": "integer", "minimum": 200,
                                                                          "maximum": 599}},
     "required": ["status", "code"]},
    {"type": "object", "properties": {"first": NAME, "last": NAME, "email": {"type": "string",
                                                                              "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
     "required": ["first", "last", "email"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {"type": "number", "minimum": 0,
                                                                             "maximum": 10},
                                                 "minItems": 1, "maxItems": 3}, "passed": {"type": "boolean"}},
     "required": ["scores", "passed"]},
    {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0,
                                                                               "maximum": 4},
                                      "owner": {"type": "object", "properties": {"name": NAME},
                                                "required": ["name"]}},
     "required": ["kind", "legs", "owner"]},
    {"type": "string", "enum": ["alpha", "beta", "gamma"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 2}}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "label": {"type": ["string", "null"], "maxLength": 10},
                                      "price": {"type": "number", "minimum": 0.5, "maximum": 99.5}},
     "required": ["id", "label", "price"]},
]

PROMPTS = [
    "Answer with JSON only.",
    "Here is the record you asked for, as JSON:",
    "Fill in the form. Output:",
    "Describe a random example in JSON.",
    "Q: give me some data.\nA:",
]
