"""Identity (client JWTs) and per-call tokens.

Client JWTs are verified with the configured HS256 secret or public key (RS256
for an RSA key, ES256 for an EC P-256 key). Per-call tokens (for `tool.result`)
are HMACs under a key derived from a server secret with a fixed label, so a
client JWT can never pass as a call token or the other way round.
"""

import binascii
import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal

import jwt
import orjson
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from server.records import quick_init
from server.settings import Settings

Role = Literal["editor", "viewer"]


class AuthError(Exception):
    """A token was missing, malformed, badly signed or expired."""


def jwt_problem(exc: jwt.PyJWTError) -> str:
    """What is wrong with a token, in our words: PyJWT's own text can be a
    Python repr of the claims or the key material's parse error."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "bad signature"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "wrong audience"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        if exc.claim in ("sub", "exp", "aud", "iat", "nbf"):
            return f"token lacks the required {exc.claim!r} claim"
        return "token lacks a required claim"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token not valid yet"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return "token signed with an algorithm this server does not accept"
    if isinstance(exc, jwt.DecodeError):
        return "malformed token"
    return "invalid token"


_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")


def b64url_encode(data: bytes) -> bytes:
    """`base64.urlsafe_b64encode(data).rstrip(b"=")`, in two C calls instead of four
    Python ones (a round trip encodes and decodes a call token three times)."""
    return binascii.b2a_base64(data, newline=False).translate(_TO_URLSAFE).rstrip(b"=")


def b64url_decode(data: bytes) -> bytes:
    """`base64.urlsafe_b64decode` of unpadded `data`, as lenient (characters outside
    the alphabet are skipped); raises `binascii.Error`, a `ValueError`."""
    return binascii.a2b_base64((data + b"=" * (-len(data) % 4)).translate(_TO_STANDARD))


class _Hmac:
    """HMAC-SHA256 under one key, the pads' hash states computed once (RFC 2104):
    a MAC is then two copies and two updates, half the cost of `hmac.new`, which
    derives them again for every token."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in key))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in key))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


# token -> user of the tokens this process issued last: the writers of a `tool.call`
# ask whose token it carries (`call_token_user`) for every connection it goes to,
# right after it was issued here. A token is unique (it names its call), so one map
# serves every `Authenticator` of the process.
_ISSUED_USERS: dict[str, str] = {}
ISSUED_USERS_KEPT = 1024


def call_token_user(token: str) -> str | None:
    """The user a per-call token was issued to, read without verifying it.

    Only for deciding who may *see* a token (the writer strips tokens from
    other users' `tool.call` frames); acceptance always goes through
    `check_call_token`. A token issued here is known without decoding it.
    """
    known = _ISSUED_USERS.get(token)
    if known is not None:
        return known
    body = token.split(".", 1)[0].encode()
    try:
        payload = orjson.loads(b64url_decode(body))
    except (ValueError, orjson.JSONDecodeError):
        return None
    if isinstance(payload, list) and len(payload) == 5 and isinstance(payload[2], str):
        return payload[2]
    return None


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: str
    docs: frozenset[str]
    role: Role
    expires_at: float

    def may_open(self, document_id: str) -> bool:
        return "*" in self.docs or document_id in self.docs


@quick_init
@dataclass(frozen=True, slots=True)
class CallGrant:
    """What a per-call token was issued for."""

    run_id: str
    call_id: str
    user_id: str
    document_id: str
    expires_at_ms: int


logger = logging.getLogger("cowrite.auth")
MIN_SECRET_BYTES = 32
"""RFC 7518 section 3.2: an HS256 key of at least the hash's size."""


def _public_key(pem: str) -> tuple[Any, str]:
    """The verification key of `COWRITE_JWT_PUBLIC_KEY` and the one algorithm it verifies,
    checked at start: a key that is not a PEM public key refused every token later, with
    nothing in the log. One algorithm, the key's own: with both RS256 and ES256 allowed, a
    token naming the other key type's (`{"alg":"ES256"}` and an RSA key) made PyJWT raise
    a TypeError, a 500 on every HTTP route and a dropped document socket."""
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError("COWRITE_JWT_PUBLIC_KEY is not a PEM public key (RSA or EC, "
                         "-----BEGIN PUBLIC KEY-----)") from None
    if isinstance(key, rsa.RSAPublicKey):
        return key, "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key, "ES256"
    raise ValueError("COWRITE_JWT_PUBLIC_KEY must be an RSA key (RS256) or an EC P-256 key "
                     "(ES256); other key types and curves are not accepted")


class Authenticator:
    """Verifies client JWTs and issues/verifies per-call tokens."""

    def __init__(self, settings: Settings) -> None:
        self._audience = settings.jwt_audience
        if settings.jwt_public_key:
            key, algorithm = _public_key(settings.jwt_public_key)
            self._verify_key: Any = key
            self._algorithms = [algorithm]
            self._signing_secret: bytes | None = None
        elif settings.jwt_secret:
            self._signing_secret = settings.jwt_secret.get_secret_value().encode()
            self._verify_key = self._signing_secret
            self._algorithms = ["HS256"]
            if len(self._signing_secret) < MIN_SECRET_BYTES:
                logger.warning("COWRITE_JWT_SECRET is %d bytes; HS256 wants at least %d "
                               "(e.g. `openssl rand -hex 32`)", len(self._signing_secret),
                               MIN_SECRET_BYTES)
        elif settings.dev:
            # Development: a fresh secret per process; /v1/dev/token signs with it.
            self._signing_secret = secrets.token_bytes(32)
            self._verify_key = self._signing_secret
            self._algorithms = ["HS256"]
        else:
            raise ValueError(
                "set COWRITE_JWT_SECRET or COWRITE_JWT_PUBLIC_KEY "
                "(or COWRITE_DEV=1 for development)"
            )
        drawn = not settings.jwt_public_key and not settings.jwt_secret  # dev: random
        if settings.call_token_secret:
            root, drawn = settings.call_token_secret.get_secret_value().encode(), False
        elif self._signing_secret is not None:
            root = self._signing_secret
        else:
            root, drawn = secrets.token_bytes(32), True
        if drawn and settings.redis_url:
            raise ValueError(
                "with COWRITE_REDIS_URL every instance must sign call tokens with the same key: "
                "set COWRITE_JWT_SECRET or COWRITE_CALL_TOKEN_SECRET (the same on every instance)")
        self._call_key = hmac.new(root, b"cowrite call-token key v1", hashlib.sha256).digest()
        self._call_mac = _Hmac(self._call_key)

    def verify(self, token: str | None) -> Principal:
        if not token:
            raise AuthError("missing token")
        try:
            claims = jwt.decode(
                token,
                self._verify_key,
                algorithms=self._algorithms,
                audience=self._audience,
                options={"require": ["sub", "exp"], "verify_aud": self._audience is not None},
            )
        except jwt.PyJWTError as exc:
            raise AuthError(jwt_problem(exc)) from exc
        except (TypeError, ValueError) as exc:  # a token PyJWT fails on without its errors
            raise AuthError("invalid token") from exc
        sub, docs, role = claims.get("sub"), claims.get("docs", []), claims.get("role", "editor")
        if not isinstance(sub, str) or not sub:
            raise AuthError("invalid token: 'sub' must be a non-empty string")
        if not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
            raise AuthError("invalid token: 'docs' must be a list of strings")
        if role not in ("editor", "viewer"):
            raise AuthError("invalid token: 'role' must be 'editor' or 'viewer'")
        try:
            expires = float(claims["exp"])  # pyjwt checked it is a number; it may not fit
        except (OverflowError, ValueError):
            raise AuthError("invalid token: 'exp' is out of range") from None
        return Principal(sub, frozenset(docs), role, expires)

    def issue_dev_token(
        self, user: str, docs: list[str], role: Role, ttl_s: float = 3600.0
    ) -> str:
        if self._signing_secret is None:
            raise AuthError("development tokens need an HS256 secret")
        claims: dict[str, Any] = {
            "sub": user, "docs": docs, "role": role, "exp": int(time.time() + ttl_s)
        }
        if self._audience:
            claims["aud"] = self._audience
        return jwt.encode(claims, self._signing_secret, algorithm="HS256")

    def issue_call_token(self, grant: CallGrant) -> str:
        payload = orjson.dumps(
            [grant.run_id, grant.call_id, grant.user_id, grant.document_id, grant.expires_at_ms]
        )
        body = b64url_encode(payload)
        token = (body + b"." + b64url_encode(self._call_mac.digest(body))).decode()
        issued = _ISSUED_USERS
        issued[token] = grant.user_id
        if len(issued) > ISSUED_USERS_KEPT:
            del issued[next(iter(issued))]
        return token

    def check_call_token(self, token: str, expected: CallGrant, now_ms: int) -> str | None:
        """None when `token` was issued for exactly `expected` and is unexpired; else why not."""
        body, _, mac = token.encode().partition(b".")
        try:
            given_mac = b64url_decode(mac)
            payload = orjson.loads(b64url_decode(body))
        except (ValueError, orjson.JSONDecodeError):
            return "malformed call token"
        if not hmac.compare_digest(given_mac, self._call_mac.digest(body)):
            return "call token signature mismatch"
        want = [expected.run_id, expected.call_id, expected.user_id, expected.document_id]
        if not isinstance(payload, list) or len(payload) != 5 or payload[:4] != want:
            return "call token was issued for another call, user or document"
        if not isinstance(payload[4], int) or payload[4] < now_ms:
            return "call token expired"
        return None
