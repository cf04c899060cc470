"""Outbound HTTP from a handler, through the host's ``wasi:http`` outgoing handler.

A handler reaches only the hosts its subscription grants with ``allowed_outbound_hosts``; any
other request fails with :class:`HttpError` of kind ``denied`` before a connection is attempted.
Every request is bounded by the subscription's ``http_timeout``; ``timeout=`` asks for less::

    from sluice_guest import http

    response = http.post("http://gateway:7878/charge", json=payment, timeout=2.0,
                         headers={"idempotency-key": payment["id"]})
    if response.status == 200:
        ...

Calls block the handler until the whole response is read; the host serves other deliveries
meanwhile.
"""

import json as _json
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as w

_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024


class HttpError(Exception):
    """Why a request failed. ``kind`` is ``denied`` (not on the grant: retrying will not help),
    ``timeout`` (the other side may still have acted), ``connect``, ``invalid`` or ``other``."""

    def __init__(self, method: str, url: str, kind: str, detail: str = ""):
        self.method, self.url, self.kind, self.detail = method, url, kind, detail
        super().__init__(str(self))

    def __str__(self) -> str:
        what = {
            "denied": "denied by the host: the target is not on this subscription's "
                      "allowed_outbound_hosts",
            "timeout": "timed out",
            "connect": f"cannot connect ({self.detail})",
            "invalid": f"invalid request: {self.detail}",
        }.get(self.kind, self.detail)
        return f"HTTP {self.method} {self.url}: {what}"

    @property
    def is_timeout(self) -> bool:
        return self.kind == "timeout"

    @property
    def is_denied(self) -> bool:
        return self.kind == "denied"


_TIMEOUTS = (w.ErrorCode_ConnectionTimeout, w.ErrorCode_ConnectionReadTimeout,
             w.ErrorCode_ConnectionWriteTimeout, w.ErrorCode_HttpResponseTimeout,
             w.ErrorCode_DnsTimeout)
_CONNECT = (w.ErrorCode_ConnectionRefused, w.ErrorCode_DestinationNotFound,
            w.ErrorCode_DestinationUnavailable, w.ErrorCode_DestinationIpProhibited,
            w.ErrorCode_DestinationIpUnroutable, w.ErrorCode_DnsError)


def _kind(code: Any) -> Tuple[str, str]:
    name = type(code).__name__.removeprefix("ErrorCode_")
    if isinstance(code, w.ErrorCode_HttpRequestDenied):
        return "denied", name
    if isinstance(code, _TIMEOUTS):
        return "timeout", name
    if isinstance(code, _CONNECT):
        return "connect", name
    if isinstance(code, (w.ErrorCode_HttpRequestUriInvalid, w.ErrorCode_HttpRequestMethodInvalid)):
        return "invalid", name
    return "other", name


class Response:
    """A whole response: ``status``, ``headers`` (name, bytes) pairs, ``body`` bytes."""

    def __init__(self, status: int, headers: List[Tuple[str, bytes]], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        """The first value of a header, if it is UTF-8."""
        for n, v in self.headers:
            if n.lower() == name.lower():
                try:
                    return v.decode()
                except UnicodeDecodeError:
                    return None
        return None

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return _json.loads(self.body)


_METHODS = {
    "GET": w.Method_Get, "HEAD": w.Method_Head, "POST": w.Method_Post, "PUT": w.Method_Put,
    "DELETE": w.Method_Delete, "OPTIONS": w.Method_Options, "PATCH": w.Method_Patch,
}


def request(method: str, url: str, *, headers: Optional[Dict[str, str]] = None,
            body: bytes = b"", json: Any = None, timeout: Optional[float] = None) -> Response:
    """Send a request and read the whole response; raises :class:`HttpError`."""
    method = method.upper()

    def fail(kind: str, detail: str = "") -> HttpError:
        return HttpError(method, url, kind, detail)

    headers = dict(headers or {})
    if json is not None:
        body = _json.dumps(json, separators=(",", ":")).encode()
        headers.setdefault("content-type", "application/json")
    # The body is known whole: say its length, so it is not sent chunked (simple servers,
    # Python's http.server among them, read a chunked body as empty).
    if body or method not in ("GET", "HEAD"):
        if not any(k.lower() == "content-length" for k in headers):
            headers["content-length"] = str(len(body))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise fail("invalid", f"unsupported scheme `{parts.scheme}`" if parts.scheme
                   else "the URL has no scheme (http:// or https://)")
    if not parts.netloc:
        raise fail("invalid", "the URL has no host")
    try:
        fields = w.Fields.from_list([(k.lower(), str(v).encode()) for k, v in headers.items()])
    except Err as err:
        raise fail("invalid", f"bad or forbidden header: {err.value}")
    req = w.OutgoingRequest(fields)
    m = _METHODS.get(method)
    req.set_method(m() if m else w.Method_Other(method))
    req.set_scheme(w.Scheme_Https() if parts.scheme == "https" else w.Scheme_Http())
    req.set_authority(parts.netloc)
    req.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    options = None
    if timeout is not None:
        nanos = int(timeout * 1_000_000_000)
        options = w.RequestOptions()
        for setter in (options.set_connect_timeout, options.set_first_byte_timeout,
                       options.set_between_bytes_timeout):
            try:
                setter(nanos)
            except Err:
                pass  # the host keeps its own bound
    out_body = req.body()
    try:
        pending = outgoing_handler.handle(req, options)
    except Err as err:
        raise fail(*_kind(err.value))
    write_error = _write(out_body, body)
    while (result := pending.get()) is None:
        pending.subscribe().block()
    if isinstance(result, Err) or isinstance(result.value, Err):
        code = result.value.value if isinstance(result, Ok) else None
        raise fail(*_kind(code)) if code is not None else fail("other", "no response")
    incoming = result.value.value
    status = incoming.status()
    if write_error is not None and not 400 <= status < 600:
        raise fail(*write_error)
    response_headers = incoming.headers().entries()
    data = _read(incoming.consume(), fail)
    return Response(status, response_headers, data)


def _write(out_body: "w.OutgoingBody", data: bytes) -> Optional[Tuple[str, str]]:
    """Write the body; a failure is returned, not raised: the response says why, so it wins.
    The stream is closed on a failure too: the body dropped with its stream still open traps
    the whole attempt (a parent resource dropped before its child)."""
    try:
        stream = out_body.write()
    except Err as err:
        return "other", f"writing the body failed: {err.value}"
    try:
        for i in range(0, len(data), _WRITE_CHUNK):
            stream.blocking_write_and_flush(data[i:i + _WRITE_CHUNK])
    except Err as err:
        stream.__exit__(None, None, None)
        return "other", f"writing the body failed: {err.value}"
    stream.__exit__(None, None, None)
    try:
        w.OutgoingBody.finish(out_body, None)
    except Err as err:
        return "other", f"finishing the body failed: {err.value}"
    return None


def _read(body: "w.IncomingBody", fail) -> bytes:
    stream = body.stream()
    chunks = []
    while True:
        try:
            chunks.append(stream.blocking_read(_READ_CHUNK))
        except Err as err:
            if isinstance(err.value, streams.StreamError_Closed):
                break
            code = w.http_error_code(err.value.value)
            raise fail(*_kind(code)) if code is not None else fail("other", "reading the body")
    stream.__exit__(None, None, None)
    w.IncomingBody.finish(body)
    return b"".join(chunks)


def get(url: str, **kwargs: Any) -> Response:
    """A GET request."""
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> Response:
    """A POST request."""
    return request("POST", url, **kwargs)


def put(url: str, **kwargs: Any) -> Response:
    """A PUT request."""
    return request("PUT", url, **kwargs)


def delete(url: str, **kwargs: Any) -> Response:
    """A DELETE request."""
    return request("DELETE", url, **kwargs)
