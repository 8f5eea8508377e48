"""The 20 JSON schemas of the structured-output acceptance test (issue 18).

Every string, array and number is bounded so a 135M model at temperature 1.0
finishes the value within the test's max_tokens: the test asserts that every
output validates, so an output cut by the length limit would be a failure.
"""

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SHORT = {"type": "string", "maxLength": 16}

SCHEMAS = [
    # 1 flat object, all required
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    # 2 nested objects
    {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"first": NAME, "last": NAME}, "required": ["first", "last"]},
        "address": {"type": "object", "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"]}},
     "required": ["person", "address"]},
    # 3 array with min/max items of enums
    {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "minItems": 2, "maxItems": 4}},
     "required": ["colors"]},
    # 4 enum of mixed types
    {"type": "object", "properties": {"level": {"enum": ["low", "mid", "high", 1, 2, None]}}, "required": ["level"]},
    # 5 anyOf string | integer
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9999}, SHORT]}},
     "required": ["id"]},
    # 6 $ref / $defs
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                                                          "y": {"type": "integer", "minimum": -100, "maximum": 100}},
                         "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
     "required": ["a", "b"]},
    # 7 optional fields
    {"type": "object", "properties": {"title": NAME, "subtitle": SHORT, "year": {"type": "integer", "minimum": 1900,
                                                                               "maximum": 2100}},
     "required": ["title"]},
    # 8 pattern: phone number
    {"type": "object", "properties": {"phone": {"type": "string", "pattern": "^\\+?[0-9]{3}-[0-9]{3}-[0-9]{4}$"}},
     "required": ["phone"]},
    # 9 number bounds (exclusive)
    {"type": "object", "properties": {"score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                                      "weight": {"type": "number", "minimum": 0, "maximum": 500}},
     "required": ["score", "weight"]},
    # 10 boolean and null
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok", "note"]},
    # 11 array of objects
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"]}}},
     "required": ["items"]},
    # 12 const
    {"type": "object", "properties": {"version": {"const": "v1"}, "kind": {"const": 3}}, "required": ["version", "kind"]},
    # 13 top-level array
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 50}, "minItems": 1, "maxItems": 5},
    # 14 string formats
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "uid": {"type": "string", "format": "uuid"}},
     "required": ["day", "uid"]},
    # 15 oneOf of objects
    {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1,
                                                                            "maximum": 9}},
         "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1,
                                                                               "maximum": 9}},
         "required": ["kind", "side"]}]}},
     "required": ["shape"]},
    # 16 recursive $ref (a tree, depth bounded by maxItems 0 at the leaves' level)
    {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["v"]},
               "node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "kids": {"type": "array", "maxItems": 2,
                                                                  "items": {"$ref": "#/$defs/leaf"}}},
                        "required": ["v", "kids"]}},
     "$ref": "#/$defs/node"},
    # 17 enum of strings, sentiment classifier
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                      "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
     "required": ["sentiment", "confidence"]},
    # 18 additionalProperties false with optional keys
    {"type": "object", "additionalProperties": False,
     "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}}},
    # 19 nested arrays
    {"type": "object", "properties": {"grid": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["grid"]},
    # 20 pattern + enum + length bounds in one object
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{3}$"},
                                      "status": {"enum": ["open", "closed"]},
                                      "tag": {"type": "string", "minLength": 2, "maxLength": 8}},
     "required": ["code", "status"]},
]
assert len(SCHEMAS) == 20
