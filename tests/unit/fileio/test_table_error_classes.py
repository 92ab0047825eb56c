"""Which failures of the table format libraries are transient (retried) and which are not
(:func:`pipeline.storage_retry.is_transient_table_error`), on the messages delta-rs, pyarrow and pyiceberg give."""
from __future__ import annotations

import pytest

from pipeline.storage_retry import is_transient_table_error

pytestmark = pytest.mark.unit

PUT_500 = ("When initiating multiple part upload for key 'root/sink/job/paid/metadata/{key}-m0.avro' in bucket "
           "'epochal-test': AWS Error INTERNAL_FAILURE during CreateMultipartUpload operation: We encountered an "
           "internal error. (Request ID: epochal-fault)")


@pytest.mark.parametrize("key", ["3344190d-b2a9-4d96-81d3-68437d14dbb0",
                                 "6c429032-701c-403f-ab0e-72f5148bd625",   # "403" inside the key (CI, 2026-11-29)
                                 "a-403-b"])
def test_a_server_error_is_transient_whatever_the_key_it_names(key):
    assert is_transient_table_error(OSError(PUT_500.format(key=key)))


@pytest.mark.parametrize("text", [
    "Generic S3 error: Error performing put request x: response error, after 0 retries: HTTP status client error "
    "(403 Forbidden) for url (http://127.0.0.1:9/b/k)",
    "An error occurred (403) when calling the HeadObject operation: Forbidden",
    "When reading information for key 'k' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject operation: "
    "Access Denied; connection reset",
    "Generic S3 error: status: 403, connection closed",
])
def test_auth_errors_are_never_transient(text):
    assert not is_transient_table_error(OSError(text))
