"""S3 multipart uploads left incomplete: listing and aborting them, which obstore cannot.

obstore (0.12) uploads big objects as S3 multipart uploads but exposes neither their ids nor
ListMultipartUploads / AbortMultipartUpload, so an upload cut short by a crash (or a failure
obstore does not clean up) keeps its parts, billed, until a bucket lifecycle rule removes
them. ``S3MultipartUploads`` makes those two calls itself: plain HTTP signed with AWS
Signature Version 4, the store's own endpoint, bucket, region and static credentials
(``storage.aws_*`` keys, else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``). Without static credentials (instance roles, web identity) it is not
built, and a lifecycle rule (``AbortIncompleteMultipartUpload``) is the only cleanup.

Thread-safe: each call is its own HTTP request.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from strata.tiered.api import RemoteStorageException, RetriableRemoteStorageException

__all__ = ["MultipartUpload", "S3MultipartUploads"]

log = logging.getLogger(__name__)

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclasses.dataclass(frozen=True)
class MultipartUpload:
    """An incomplete multipart upload: the object key (relative to the store's prefix), its
    upload id and when it was initiated (epoch ms)."""

    key: str
    upload_id: str
    initiated_ms: int


def _quote(text: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(text, safe=safe)


def _option(config: Mapping[str, Any], name: str) -> str | None:
    """``aws_<name>`` or ``<name>`` from an obstore S3 config."""
    for key in (f"aws_{name}", name):
        value = config.get(key)
        if value not in (None, ""):
            return str(value)
    return None


class S3MultipartUploads:
    """ListMultipartUploads and AbortMultipartUpload on one bucket (under ``prefix``)."""

    def __init__(self, bucket: str, *, region: str, access_key_id: str,
                 secret_access_key: str, session_token: str | None = None,
                 endpoint: str | None = None, virtual_hosted: bool = False, prefix: str = "",
                 timeout: float = 30.0) -> None:
        self.bucket = bucket
        self.region = region
        self.prefix = prefix
        self.timeout = timeout
        self._key_id = access_key_id
        self._secret = secret_access_key
        self._token = session_token
        if endpoint:
            base = endpoint.rstrip("/")
            # obstore's rule: a virtual-hosted endpoint already names the bucket
            self._base = base if virtual_hosted else f"{base}/{_quote(bucket)}"
        elif virtual_hosted:
            self._base = f"https://{bucket}.s3.{region}.amazonaws.com"
        else:
            self._base = f"https://s3.{region}.amazonaws.com/{_quote(bucket)}"

    @classmethod
    def from_config(cls, url: str, config: Mapping[str, Any]) -> S3MultipartUploads | None:
        """For an ``s3://bucket[/prefix]`` store opened with obstore ``config``; None for
        other schemes or without static credentials."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() not in ("s3", "s3a") or not parts.netloc:
            return None
        key_id = _option(config, "access_key_id")
        secret = _option(config, "secret_access_key")
        token = _option(config, "session_token") or _option(config, "token")
        if not key_id:
            key_id = os.environ.get("AWS_ACCESS_KEY_ID")
            secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
            token = os.environ.get("AWS_SESSION_TOKEN")
        if not key_id or not secret:
            log.info("%s: no static credentials, so incomplete multipart uploads cannot be "
                     "listed; rely on a bucket lifecycle rule (AbortIncompleteMultipartUpload)",
                     url)
            return None
        region = _option(config, "region") or _option(config, "default_region") \
            or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        prefix = parts.path.strip("/")
        return cls(parts.netloc, region=region, access_key_id=key_id, secret_access_key=secret,
                   session_token=token, endpoint=_option(config, "endpoint"),
                   virtual_hosted=str(_option(config, "virtual_hosted_style_request")).lower()
                   == "true", prefix=f"{prefix}/" if prefix else "")

    # ---- the two calls -----------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[MultipartUpload]:
        """Every incomplete upload of a key starting with ``prefix`` (all pages)."""
        out: list[MultipartUpload] = []
        markers: dict[str, str] = {}
        while True:
            query = {"uploads": "", "prefix": self.prefix + prefix, **markers}
            root = ET.fromstring(self._request("GET", "", query))
            for up in root.iter():
                if up.tag.rpartition("}")[2] != "Upload":
                    continue
                fields = {c.tag.rpartition("}")[2]: (c.text or "") for c in up}
                key = fields.get("Key", "")
                if not key.startswith(self.prefix):
                    continue
                initiated = datetime.datetime.fromisoformat(
                    fields.get("Initiated", "").replace("Z", "+00:00"))
                out.append(MultipartUpload(key[len(self.prefix):], fields.get("UploadId", ""),
                                           int(initiated.timestamp() * 1000)))
            fields = {c.tag.rpartition("}")[2]: (c.text or "") for c in root}
            if fields.get("IsTruncated", "false").lower() != "true":
                return out
            markers = {"key-marker": fields.get("NextKeyMarker", ""),
                       "upload-id-marker": fields.get("NextUploadIdMarker", "")}

    def abort(self, key: str, upload_id: str) -> None:
        """Abort one upload; an upload already gone is not an error."""
        try:
            self._request("DELETE", self.prefix + key, {"uploadId": upload_id})
        except RemoteStorageException as e:
            if "NoSuchUpload" not in str(e):
                raise

    # ---- signing (AWS Signature Version 4) ---------------------------------------------------

    def _url(self, key: str, query: Mapping[str, str]) -> str:
        path = f"{self._base}/{_quote(key, '-_.~/')}" if key else f"{self._base}/"
        return path + "?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))

    def sign(self, method: str, url: str, now: datetime.datetime) -> dict[str, str]:
        """The headers of a signed request with an empty body (``url``'s query sorted and
        encoded as ``_url`` makes it)."""
        parts = urllib.parse.urlsplit(url)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        headers = {"host": parts.netloc, "x-amz-content-sha256": _EMPTY_SHA256,
                   "x-amz-date": amz_date}
        if self._token:
            headers["x-amz-security-token"] = self._token
        signed = ";".join(sorted(headers))
        canonical = "\n".join([
            method, parts.path or "/", parts.query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, _EMPTY_SHA256])
        scope = f"{amz_date[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        k = f"AWS4{self._secret}".encode()
        for part in (amz_date[:8], self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self._key_id}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={signature}")
        return headers

    def _request(self, method: str, key: str, query: dict[str, str]) -> bytes:
        url = self._url(key, query)
        headers = self.sign(method, url, datetime.datetime.now(datetime.timezone.utc))
        request = urllib.request.Request(
            url, method=method, headers={k: v for k, v in headers.items() if k != "host"})
        what = f"{method} {url}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            body = e.read()[:500].decode(errors="replace")
            error = RetriableRemoteStorageException if e.code >= 500 or e.code == 429 \
                else RemoteStorageException
            raise error(f"{what}: HTTP {e.code}: {body}") from e
        except OSError as e:
            raise RetriableRemoteStorageException(f"{what}: {e}") from e
