"""Cross-check the config's JSON Schema, as the build generates it from the
key table (`ddplug check-config --schema`), with an independent JSON Schema
implementation (Python's jsonschema, draft 2020-12):

* the schema itself is a valid draft 2020-12 schema;
* every config in tests/data/config/good and examples/configs validates;
* every config in tests/data/config/bad that is valid JSON is rejected by
  the schema, except the cases listed in C_ONLY (rules the schema cannot
  express), which must be accepted by the schema — so the list stays exact.

usage: python3 schema_check.py SOURCE_DIR SCHEMA_FILE   (exit 77: jsonschema missing)
"""
import json
import pathlib
import sys

try:
    import jsonschema
except ImportError:
    print("jsonschema is not installed: skipped")
    sys.exit(77)

# Rules only the C loader enforces (see the schema's top-level description).
C_ONLY = {
    "12-nul-in-string": "strings must not contain NUL",
    "23-type-int-got-real": "integers are written without a fraction",
    "41-rank-not-below-world-size": "world.rank < world.world_size",
    "43-local-rank-not-below-local-world-size": "local_rank < local_world_size",
    "44-local-world-size-above-world-size": "local_world_size <= world_size",
    "45-boundaries-not-ascending": "boundaries strictly ascending",
    "61-port-zero-with-several-ranks": "rendezvous.port 0 only with world.world_size 1",
}


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def parse(path):
    """The document, or None if it is not strict JSON (a syntax case)."""
    try:
        return json.loads(path.read_bytes(), object_pairs_hook=no_duplicates,
                          parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, RecursionError):
        return None


def main():
    src = pathlib.Path(sys.argv[1])
    schema = json.loads(pathlib.Path(sys.argv[2]).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    failures = []

    good = sorted((src / "tests/data/config/good").glob("*.json"))
    good += sorted((src / "examples/configs").glob("*.json"))
    for path in good:
        errors = list(validator.iter_errors(parse(path)))
        if errors:
            failures.append(f"{path}: rejected by the schema: {errors[0].message}")

    checked = syntax = 0
    for path in sorted((src / "tests/data/config/bad").glob("*.json")):
        doc = parse(path)
        if doc is None:
            syntax += 1
            continue
        checked += 1
        valid = validator.is_valid(doc)
        if path.stem in C_ONLY and not valid:
            failures.append(f"{path}: listed as C-only ({C_ONLY[path.stem]}) "
                            "but the schema rejects it: update C_ONLY")
        elif path.stem not in C_ONLY and valid:
            failures.append(f"{path}: the C loader rejects it, the schema accepts it")

    for f in failures:
        print("FAIL", f)
    print(f"{len(good)} good configs valid, {checked} bad configs checked "
          f"({len(C_ONLY)} C-only), {syntax} syntax cases skipped")
    print(f"{len(good) + checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
