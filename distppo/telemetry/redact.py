"""URIs as distppo prints them: with any credentials in them replaced by `***`.

A storage or tracking URI may carry credentials: the user information of
`s3://KEY:SECRET@bucket/...` or `http://user:token@mlflow:5000`, and query values such as
pyarrow's `?access_key=...&secret_key=...&session_token=...` or a presigned URL's
`X-Amz-Signature`. distppo keeps the URI as given for the file systems and trackers that need
it, and passes every URI it prints (log lines, errors, the sweep summary, the report) through
`redact`, or a whole line through `redact_text`, so a log shared in an issue or a CI job leaks
none of them.
"""
from __future__ import annotations

import re

MASK = "***"
# query keys whose values are secrets: pyarrow's S3 options (access_key, secret_key,
# session_token), AWS presigned URLs (X-Amz-Credential, X-Amz-Signature, X-Amz-Security-Token),
# Azure SAS (sig), and the usual names of passwords, tokens and API keys
SECRET_KEY_PARTS = ("secret", "password", "passwd", "token", "key", "credential", "signature",
                    "auth")
SECRET_KEYS = {"sig", "pwd", "pass"}
# scheme://userinfo@ : everything between `//` and the first `@` before the query; `/` allowed,
# since an AWS secret key holds `/` and people paste it unencoded (a path with `@` in it loses
# a little more than needed, never a secret)
USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^?#@]*@")
# a URI inside free text: a scheme, `://`, then up to whitespace or a quote, less the
# punctuation that ends a clause after it ("storage s3://b/x: denied")
URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]*[^\s'\"`<>.,;:)\]]")


def _secret_key(key: str) -> bool:
    key = key.lower()
    return key in SECRET_KEYS or any(part in key for part in SECRET_KEY_PARTS)


def _redact_query(query: str) -> str:
    pairs = []
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        pairs.append(f"{key}={MASK}" if eq and value and _secret_key(key) else pair)
    return "&".join(pairs)


def redact(uri: str) -> str:
    """`uri` with its user information and secret query values replaced by `***`; the rest
    (scheme, host, path, other query options) unchanged, and a plain path returned as it is."""
    if "://" not in uri:
        return uri
    uri = USERINFO.sub(rf"\g<1>{MASK}@", uri, count=1)
    base, sep, rest = uri.partition("?")
    if not sep:
        return uri
    query, hash_sign, fragment = rest.partition("#")
    return f"{base}?{_redact_query(query)}{hash_sign}{fragment}"


def redact_text(text: str) -> str:
    """Every URI inside a line of text (an error message that quotes one) redacted."""
    return URI_IN_TEXT.sub(lambda m: redact(m.group(0)), text)
