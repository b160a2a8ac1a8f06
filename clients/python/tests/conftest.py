"""A real ``tollgate serve`` per test, on a free port, with a config the test
writes, on the memory store and on a Redis node (a ``redis-server`` the
session starts; skipped when none is installed, unless
``TOLLGATE_TEST_REQUIRE_REDIS`` is set); HS256 tokens minted here.

The binary is ``$TOLLGATE_BIN``, else ``target/debug/tollgate`` of this
repository (``cargo build -p tollgate-server``). The sidecar has no fake
clock: tests that depend on time use short periods and TTLs and state their
tolerances.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
SECRET = "tollgate-python-test-secret-0123456789abcdef"
ISSUER = "https://issuer.test"
AUDIENCE = "tollgate-test"
ADMIN = "admin-token-0123456789abcdef"

# SPEC §7's "support" plan for everyone; a few others for the tests that
# need short TTLs or longer waits, and "meter" (refilling 1 token an hour,
# so balances are exact in real time) for the ADK tests.
PLANS = """
[plans.support]
turns = { amount = 20, period_ms = 60000, burst = 5 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
concurrent_runs = 2
max_wait_ms = 2000
estimate_tokens = 6000

[plans.patient]
turns = { amount = 20, period_ms = 60000, burst = 5 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
concurrent_runs = 2
max_wait_ms = 6000
estimate_tokens = 6000

[plans.short]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 600000, period_ms = 60000, burst = 600000 }
concurrent_runs = 2
lease_ttl_ms = 600
estimate_tokens = 500

[plans.roomy]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 600000, period_ms = 60000, burst = 600000 }
concurrent_runs = 8
estimate_tokens = 500

[plans.onecall]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 600000, period_ms = 60000, burst = 600000 }
concurrent_runs = 8
max_llm_calls = 1
estimate_tokens = 500

[plans.four]
turns = { amount = 1, period_ms = 3600000, burst = 8 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
concurrent_runs = 2
lease_ttl_ms = 1000
estimate_tokens = 500

[plans.meter]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 1, period_ms = 3600000, burst = 100000 }
concurrent_runs = 2
estimate_tokens = 500

[users]
patient = "patient"
shorty = "short"
roomy = "roomy"
onecall = "onecall"
eve = "four"

[providers."gemini:flash"]
requests = { amount = 600, period_ms = 60000, burst = 10 }
policy = "reject"

# Fair sharing (SPEC §5): 6 requests/min (a permit is 10 s of the pool, so
# real time hardly moves the fair clock), burst 10, tenants weighted 3:1.
[providers."gemini:fair"]
requests = { amount = 6, period_ms = 60000, burst = 10 }
max_wait_ms = 60000

[providers."gemini:fair".tenants.a]
weight = 3

[providers."gemini:fair".tenants.b]
weight = 1
"""


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(user: str, *, scope: Optional[str] = None, secret: str = SECRET, **extra: str) -> str:
    """An HS256 token for ``user`` valid for an hour (``extra``: more
    claims, e.g. ``org`` for a sidecar whose ``tenant_claim`` is "org")."""
    header = {"alg": "HS256", "typ": "JWT"}
    now = int(time.time())
    claims: dict = {"sub": user, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 3600}
    claims.update(extra)
    if scope:
        claims["scope"] = scope
    signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    sig = hmac.new(secret.encode(), signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{b64(sig)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary() -> str:
    b = os.environ.get("TOLLGATE_BIN") or str(ROOT / "target" / "debug" / "tollgate")
    if not Path(b).is_file():
        pytest.fail(f"no tollgate binary at {b}: run `cargo build -p tollgate-server` or set TOLLGATE_BIN")
    return b


@dataclass
class Sidecar:
    """A running ``tollgate serve``."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def user(self, user: str) -> dict:
        r = httpx.get(f"{self.url}/admin/users/{user}", headers={"authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sidecar(
    tmp: Path, extra: str = "", store: str = "", default_plan: str = "support", identity: str = ""
) -> Sidecar:
    port = free_port()
    cfg = tmp / f"tollgate-{uuid.uuid4().hex[:8]}.toml"
    cfg.write_text(
        f"""
listen = "127.0.0.1:{port}"
admin_token = "{ADMIN}"
default_plan = "{default_plan}"
{extra}
{store}

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
{identity}
{PLANS}
"""
    )
    log = tmp / f"{cfg.stem}.log"
    proc = subprocess.Popen(
        [binary(), "serve", "--config", str(cfg)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"tollgate serve exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                return Sidecar(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"tollgate serve did not answer on {url}: {log.read_text()}")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``redis-server`` this test session starts (on
    ``$TOLLGATE_TEST_REDIS_PORT``, else a free port) and stops."""
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("TOLLGATE_TEST_REQUIRE_REDIS"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = int(os.environ.get("TOLLGATE_TEST_REDIS_PORT") or free_port())
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(d)],
        stdout=(d / "redis.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"redis-server did not start on {port}: {(d / 'redis.log').read_text()}")
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _store(request: pytest.FixtureRequest) -> str:
    return store_config(request.param, request)


def store_config(kind: str, request: pytest.FixtureRequest) -> str:
    """The ``[store]`` table of a sidecar on ``kind`` (``memory`` or
    ``redis``: the session's Redis, with a key prefix of its own)."""
    if kind == "memory":
        return ""
    url = request.getfixturevalue("redis_url")
    # A prefix of its own per sidecar: tests share the one Redis.
    return f"""
[store]
kind = "redis"
url = "{url}"
key_prefix = "py{uuid.uuid4().hex[:12]}"
op_timeout_ms = 1000
"""


@pytest.fixture(params=["memory", "redis"])
def sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sidecar]:
    """A fresh sidecar, on the memory store and on a Redis node."""
    s = start_sidecar(tmp_path, store=_store(request))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(params=["memory", "redis"])
def meter_sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sidecar]:
    """A fresh sidecar whose default plan is "meter", on the memory store
    and on a Redis node."""
    s = start_sidecar(tmp_path, store=_store(request), default_plan="meter")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(params=["memory", "redis"])
def claim_sidecar(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sidecar]:
    """A fresh "meter" sidecar whose tenant is the verified token's ``org``
    claim (``tenant_claim``), on the memory store and on a Redis node."""
    s = start_sidecar(tmp_path, store=_store(request), default_plan="meter", identity='tenant_claim = "org"')
    try:
        yield s
    finally:
        s.stop()
