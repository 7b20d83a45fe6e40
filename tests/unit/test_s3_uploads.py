"""The S3 multipart-upload calls obstore lacks: requests signed exactly as botocore signs
them (AWS Signature Version 4), when the helper can be built at all, and a failed upload
aborting its own multipart uploads at once. The sweep against a real S3-API server is in
``tests/integration/test_remote_storage_s3.py``."""

from __future__ import annotations

import datetime
import io

import obstore.store
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from strata.tiered.api import RemoteStorageException
from strata.tiered.storage import object_store as object_store_module
from strata.tiered.storage.object_store import ObstoreObjectStore
from strata.tiered.storage.s3_uploads import MultipartUpload, S3MultipartUploads

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("token", [None, "session-token"])
@pytest.mark.parametrize("method, key, query", [
    ("GET", "", {"uploads": "", "prefix": "pre/orders a+b/"}),
    ("GET", "", {"uploads": "", "prefix": "pre/", "key-marker": "k", "upload-id-marker": "u~1"}),
    ("DELETE", "pre/orders-x/0/00000000000000000000-AbC_d.log", {"uploadId": "x/y+z=="}),
])
def test_requests_are_signed_as_botocore_signs_them(method, key, query, token):
    uploads = S3MultipartUploads("bkt", region="eu-west-1", access_key_id="AKID",
                                 secret_access_key="SECRET", session_token=token,
                                 endpoint="http://127.0.0.1:9000", prefix="pre/")
    url = uploads._url(key, query)
    request = AWSRequest(method=method, url=url, headers={"x-amz-content-sha256": EMPTY_SHA256})
    S3SigV4Auth(Credentials("AKID", "SECRET", token), "s3", "eu-west-1").add_auth(request)
    when = datetime.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    assert uploads.sign(method, url, when)["authorization"] == request.headers["Authorization"]


def test_built_for_s3_urls_with_static_credentials_only(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    keys = {"aws_access_key_id": "a", "aws_secret_access_key": "s",
            "aws_endpoint": "http://127.0.0.1:9000", "aws_region": "eu-west-1"}
    built = S3MultipartUploads.from_config("s3://bkt/some/prefix", keys)
    assert built is not None and built.prefix == "some/prefix/" and built.region == "eu-west-1"
    assert built._url("k", {"uploads": ""}) == "http://127.0.0.1:9000/bkt/k?uploads="
    assert S3MultipartUploads.from_config("gs://bkt", keys) is None
    assert S3MultipartUploads.from_config("s3://bkt", {}) is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    assert S3MultipartUploads.from_config("s3://bkt", {}) is not None


class _RecordingUploads:
    """Stands in for the S3 helper: lists the given uploads, records the aborts."""

    def __init__(self, *uploads: MultipartUpload) -> None:
        self.uploads = list(uploads)
        self.aborted: list[tuple[str, str]] = []

    def list(self, prefix: str = "") -> list[MultipartUpload]:
        return [u for u in self.uploads if u.key.startswith(prefix)]

    def abort(self, key: str, upload_id: str) -> None:
        self.aborted.append((key, upload_id))


def test_a_failed_upload_aborts_its_own_multipart_uploads_at_once(monkeypatch, tmp_path):
    uploads = _RecordingUploads(MultipartUpload("seg.log", "u1", 0),
                                MultipartUpload("seg.log.other", "u2", 0))
    store = ObstoreObjectStore(obstore.store.MemoryStore(), uploads=uploads)

    class Unreadable(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            raise OSError("I/O error")
    monkeypatch.setattr(object_store_module, "open", lambda path, mode: Unreadable(),
                        raising=False)
    with pytest.raises(RemoteStorageException):
        store.put_file("seg.log", tmp_path / "anything")
    assert uploads.aborted == [("seg.log", "u1")]
