"""Requests as a client puts them on the wire, for tests that talk bytes to the codec or a broker."""

from strata.protocol.client import client_frame, framed  # noqa: F401
