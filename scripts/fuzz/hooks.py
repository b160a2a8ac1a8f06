"""schemathesis hooks for scripts/fuzz-api (loaded by scripts/fuzz/schemathesis.toml).

Two kinds of generated case are dropped, each for a reason outside the
server, so that what remains is held to every check:

* An id that fits JSON Schema's `maxLength` (which counts characters) but
  not tollgate's limit (512 bytes of UTF-8, SPEC §8): JSON Schema cannot
  state a byte length, so the document says it in words. ASCII ids reach
  512 characters; others fewer.
* A run's invocation id with a `%` in it: the stateful phase carries it
  from `POST /v1/runs`'s body into the path of `…/renew` and `DELETE`, and
  schemathesis unquotes a path value before quoting it (transport/
  serialization.py `quote_all`), so `%26` would reach the server as `&` —
  another run. Other operations still get such ids in bodies and paths.

And one kind for a reason outside tollgate altogether:

* A header whose value is urllib3's `SKIP_HEADER` sentinel
  (`"@@@SKIP_HEADER@@@"`): urllib3 refuses to send it (a client-side
  ValueError, reported as a runtime error). Hypothesis draws string
  constants from the modules it finds outside site-packages, and
  schemathesis is installed with `--target` into a directory of its own, so
  urllib3's sentinel is among them (seen once in about 11,000 cases).
"""

import schemathesis
from urllib3.util import SKIP_HEADER

MAX_ID_BYTES = 512
# Body fields that are ids (`reservation_id` is `<call>.<invocation id>`).
ID_FIELDS = ("invocation_id", "session_id", "holder", "model", "tenant")


def _over_bytes(value, max_bytes=MAX_ID_BYTES):
    return isinstance(value, str) and len(value) <= max_bytes < len(value.encode("utf-8", "surrogatepass"))


def _ids(case):
    body = case.body if isinstance(case.body, dict) else {}
    for name in ID_FIELDS:
        yield body.get(name)
    reservation = body.get("reservation_id")
    if isinstance(reservation, str) and "." in reservation:
        yield reservation.split(".", 1)[1]
    for container in (case.path_parameters, case.query):
        for value in (container or {}).values():
            yield value


@schemathesis.hook
def filter_case(context, case):
    if any(v == SKIP_HEADER for v in (case.headers or {}).values()):
        return False
    if any(_over_bytes(v) for v in _ids(case)):
        return False
    if case.operation.path == "/v1/runs" and case.method.upper() == "POST":
        inv = case.body.get("invocation_id") if isinstance(case.body, dict) else None
        if isinstance(inv, str) and "%" in inv:
            return False
    return True
